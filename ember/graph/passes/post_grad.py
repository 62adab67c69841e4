"""Passes on the functional ATen graph that compile_graph lowers (forward, backward or inference)."""
from __future__ import annotations

import torch
import torch.fx

from ... import config
from .common import dead_code_elimination, run_passes

aten = torch.ops.aten


def remove_noop_ops(gm: torch.fx.GraphModule) -> None:
    """Drop casts to the dtype a value already has."""
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is torch.ops.prims.convert_element_type.default and _dtype(n.args[0]) == n.args[1]:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


_CONSTANT_FILLS = {aten.zeros_like.default: 0, aten.zeros.default: 0, aten.ones_like.default: 1,
                   aten.ones.default: 1, aten.full_like.default: None, aten.full.default: None}


def _constant_fill(node):
    """The scalar a tensor-creating node fills with, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _CONSTANT_FILLS:
        return None
    fill = _CONSTANT_FILLS[node.target]
    return node.args[1] if fill is None and len(node.args) > 1 else fill


def scatter_into_constant(gm: torch.fx.GraphModule) -> None:
    """`full(c).scatter(dim, index, v)` with one index per row (index of size 1 along dim and the
    output's size elsewhere) is `where(arange(n) == index, v, c)`: a pointwise that fuses into its
    consumers instead of a materialized tensor. Cross-entropy's backward scatters -1 into a
    [tokens, vocabulary] float32 zeros tensor this way."""
    from ..pattern import _fill_meta
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.scatter.value or n.kwargs:
            continue
        base, dim, index, value = n.args
        fill, out = _constant_fill(base), n.meta.get("val")
        idx = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if fill is None or out is None or idx is None or idx.dim() != out.dim() or out.dim() == 0:
            continue
        dim = dim % out.dim()
        if idx.shape[dim] != 1 or any(idx.shape[d] != out.shape[d] for d in range(out.dim()) if d != dim):
            continue
        shape = [1] * out.dim()
        shape[dim] = out.shape[dim]
        g = gm.graph
        with g.inserting_before(n):
            iota = g.call_function(aten.arange.start_step, (0, out.shape[dim], 1),
                                   {"dtype": idx.dtype, "device": out.device})
            hit = g.call_function(aten.eq.Tensor, (g.call_function(aten.view.default, (iota, shape)), index))
            scalars = [g.call_function(aten.full.default, ([], x), {"dtype": out.dtype, "device": out.device})
                       for x in (value, fill)]
            where = g.call_function(aten.where.self, (hit, *scalars))
        new = [iota, hit.args[0], hit, *scalars, where]
        n.replace_all_uses_with(where)
        g.erase_node(n)
        _fill_meta(gm, new)


def _dtype(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(v, "dtype", None)


PASSES: list = [remove_noop_ops, scatter_into_constant, dead_code_elimination]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.post_grad_passes)
