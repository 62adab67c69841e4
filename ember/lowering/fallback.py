"""ATen fallbacks: an op with no lowering becomes an ExternKernel, a call to ATen from the wrapper.

Tensor arguments are realized (stored) first; the output's layout is the fake tensor's (which is what
ATen's meta functions promise); a tuple result becomes one MultiOutput buffer per tensor.
"""
from __future__ import annotations

import torch
import torch.fx

from .. import metrics, state
from ..ir.nodes import ExternKernel, Layout, MultiOutput, ReinterpretView, TensorBox
from ..ir.symbolic import sympify

aten = torch.ops.aten


def realize_arg(a):
    if isinstance(a, TensorBox):
        return a.realize()
    if isinstance(a, (list, tuple)):
        return type(a)(realize_arg(b) for b in a)
    return a


def _mutated_args(op, args, kwargs) -> list:
    """Buffers an op writes into (schema args marked `Tensor(a!)`)."""
    out = []
    schema = op._schema
    for i, sa in enumerate(schema.arguments):
        if sa.alias_info is None or not sa.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(sa.name)
        if isinstance(v, TensorBox):
            out.append(v)
    return out


def fallback(op, args, kwargs, node: torch.fx.Node):
    g = state.current_graph()
    mutated = _mutated_args(op, args, kwargs)
    for m in mutated:
        if not m.is_realized() or isinstance(m.data, ReinterpretView):
            raise NotImplementedError(f"{op} mutates a value that is not a stored buffer")
    ir_args = realize_arg(list(args))
    ir_kwargs = {k: realize_arg(v) for k, v in kwargs.items()}
    metrics.fallbacks[str(op)] += 1
    val = node.meta.get("val") if node is not None else None
    mutated_names = [m.data.get_name() for m in mutated]
    if isinstance(val, torch.Tensor):
        kernel = g.register_buffer(ExternKernel(None, Layout.from_tensor(val), op, ir_args, ir_kwargs, mutated_names))
        return TensorBox(kernel)
    kernel = g.register_buffer(ExternKernel(None, None, op, ir_args, ir_kwargs, mutated_names))
    if isinstance(val, (list, tuple)):
        return _multi_outputs(g, kernel, val, ())
    return None


def _multi_outputs(g, kernel, val, path):
    out = []
    for i, v in enumerate(val):
        if isinstance(v, torch.Tensor):
            out.append(TensorBox(g.register_buffer(MultiOutput(None, Layout.from_tensor(v), kernel, path + (i,)))))
        elif isinstance(v, (list, tuple)):
            out.append(_multi_outputs(g, kernel, v, path + (i,)))
        elif isinstance(v, torch.SymInt):
            out.append(sympify(v))
        else:
            out.append(v)
    return tuple(out) if isinstance(val, tuple) else out
