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


def _dtype(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(v, "dtype", None)


PASSES: list = [remove_noop_ops, dead_code_elimination]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.post_grad_passes)
