"""Functional collectives (`torch.ops._c10d_functional`, what funcol, DTensor and FSDP2 trace into) as
collective extern calls, and `wait_tensor` as the wait that completes one (ir/collectives.py says what
each means to the scheduler and the memory planner). They are not ATen fallbacks: ember.metrics counts
them in `collectives`, not in `fallbacks`.

A functional collective returns fresh tensors; an in-place one (`all_reduce_`, `broadcast_`, the `_out`
forms) writes a buffer the graph already holds, and its result is that buffer: the lowering returns it
(no second name for the same memory, which the memory planner would not know it must keep alive).
"""
from __future__ import annotations

import torch

from .. import metrics, state
from ..ir.collectives import CollectiveKernel, WaitKernel, issuing_collective
from ..ir.nodes import ReinterpretView, TensorBox, loops_of_realized
from ..graph.passes.inplace_collectives import REINPLACED
from ..ir.symbolic import statically_known_equal
from .fallback import extern_call
from .registry import lower

# op name -> whether it writes one of its arguments (its result is that argument)
COLLECTIVE_OPS = {
    "all_reduce": False, "all_reduce_coalesced": False, "all_gather_into_tensor": False,
    "all_gather_into_tensor_coalesced": False, "reduce_scatter_tensor": False,
    "reduce_scatter_tensor_coalesced": False, "all_to_all_single": False, "broadcast": False,
    "all_reduce_": True, "all_reduce_coalesced_": True, "broadcast_": True,
    "all_gather_into_tensor_out": True, "reduce_scatter_tensor_out": True,
}


def group_name(op, args, kwargs):
    """The process group's name a collective call (`op` with `args`, `kwargs`) runs on."""
    names = [a.name for a in op._schema.arguments]
    i = names.index("group_name")
    return args[i] if i < len(args) else kwargs["group_name"]


def _issue(op, in_place: bool, *args, **kwargs):
    group = group_name(op, args, kwargs)
    g = state.current_graph()
    written = kwargs.get("out", args[0])
    if in_place and op.overloadpacket is torch.ops._c10d_functional.all_reduce_:
        target, written = _whole_buffer(args[0], g.current_node.meta.get(REINPLACED, False))
        args = (target,) + tuple(args[1:])

    def build(name, layout, op_, ir_args, ir_kwargs, mutated):
        # an in-place collective's result is the buffer it writes (returned below): it binds nothing
        return CollectiveKernel(name, None if in_place else layout, op_, ir_args, ir_kwargs, group, mutated)

    metrics.collectives[str(op)] += 1
    out = extern_call(op, args, kwargs, g.current_node, build)
    return written if in_place else out


def _whole_buffer(x: TensorBox, reinplaced: bool) -> tuple[TensorBox, TensorBox]:
    """(the stored buffer an elementwise in-place collective (all_reduce_) of x writes, the value that holds
    its result): x stored, where x is a computation; x's buffer, where x is a contiguous view of all of it (a
    product's output viewed to another shape: reducing the buffer reduces the view); else, for a functional
    all_reduce made in-place (graph/passes/inplace_collectives.py), a copy of x."""
    data = x.realize()
    if not isinstance(data, ReinterpretView):
        return x, x
    base = data.data
    if data.layout.is_contiguous() and data.layout.offset == 0 and base.layout.is_contiguous() and \
            base.layout.offset == 0 and statically_known_equal(data.layout.numel(), base.layout.numel()):
        return TensorBox(base), x
    if not reinplaced:
        raise NotImplementedError(f"all_reduce_ of a part of {base.get_name()}")
    copy = TensorBox(loops_of_realized(data))
    copy.realize()
    return copy, copy


def _wait(x):
    """wait_tensor(x) -> x, complete: later readers of x run after the wait."""
    metrics.collectives[str(torch.ops._c10d_functional.wait_tensor.default)] += 1
    g = state.current_graph()
    if not isinstance(x, TensorBox):
        raise TypeError(f"wait_tensor of {x!r}")
    waited = x.realize()
    base = waited.data if isinstance(waited, ReinterpretView) else waited
    g.register_buffer(WaitKernel(None, torch.ops._c10d_functional.wait_tensor.default, waited,
                                 issuing_collective(base, g.buffers)))
    return TensorBox(waited)


def _register() -> None:
    if not torch.distributed.is_available():
        return
    ns = torch.ops._c10d_functional
    for name, in_place in COLLECTIVE_OPS.items():
        packet = getattr(ns, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            lower(op)(lambda *a, _op=op, _in_place=in_place, **k: _issue(_op, _in_place, *a, **k))
    lower(ns.wait_tensor.default)(_wait)


_register()
