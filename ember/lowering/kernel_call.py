"""Lowering helpers for ops that become a KernelCall (ir/kernel_call.py): kernels a backend writes for one
call (FlexAttention, attention with few queries), with their tensor arguments stored at static layouts."""
from __future__ import annotations

import sympy

from .. import state
from ..ir.kernel_call import KernelCall
from ..ir.nodes import MultiOutput, TensorBox
from .fallback import realize_arg
from .registry import Unsupported


def static_ints(values) -> list[int]:
    """`values` as ints; Unsupported where one is symbolic."""
    if not all(isinstance(sympy.sympify(v), sympy.Integer) for v in values):
        raise Unsupported("kernel call with symbolic sizes or strides")
    return [int(v) for v in values]


def stored_arg(box, meta=None):
    """A tensor argument stored (Buffer or ReinterpretView) with static layout."""
    if not isinstance(box, TensorBox):
        raise Unsupported("kernel call argument is not a tensor")
    x = realize_arg(box, meta)
    static_ints([*x.layout.size, *x.layout.stride, x.layout.offset])
    return x


def register_call(kind: str, device, inputs: list, launches: list, layouts: list) -> list:
    """A KernelCall of `launches` reading `inputs`, registered with one result per layout: their TensorBoxes."""
    call = KernelCall(kind, device, inputs, launches)
    g = state.current_graph()
    g.register_buffer(call)
    outs = []
    for i, layout in enumerate(layouts):
        r = g.register_buffer(MultiOutput(None, layout, call, (i,)))
        call.results.append(r)
        outs.append(TensorBox(r))
    return outs
