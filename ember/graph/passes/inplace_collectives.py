"""An all-reduce whose input dies with it reduces that input in place.

`_c10d_functional.all_reduce(x)` returns a fresh tensor: ATen's functional op clones x (an allocation and
a device copy) and reduces the clone in place. Tensor parallelism's row-parallel products issue one per
projection, forward and backward, each on a product nothing else reads: the clone is pure cost, on the
device and on the host (an FSDP x TP Llama step's all-reduces took about twice the host time of in-place
ones). Where x's memory belongs to this graph and nothing but the all-reduce reads it, the call becomes
`all_reduce_(x)`, whose result is x's buffer (lowering/collectives.py).

x qualifies when, following it back through the ops that return a view of their input (VIEW_OPS), every node on the
way has that one reader, and the chain starts at an op that returns fresh memory (not a graph input, not
an alias of one, not a tensor the graph returns or reads again). The decision depends on the graph alone:
every rank makes the same.
"""
from __future__ import annotations

import torch
import torch.fx

from .common import VIEW_OPS, only_allocates

REINPLACED = "ember_reinplaced"    # node.meta key: an all_reduce_ this pass made (its lowering may copy)


def dies_with(x: torch.fx.Node, reader: torch.fx.Node) -> bool:
    """Whether x's memory is the graph's own and `reader` is the last (the only) thing to read it."""
    node, user = x, reader
    while True:
        if node.op != "call_function" or set(node.users) != {user}:
            return False
        if node.target in VIEW_OPS:
            node, user = node.args[0], node
            if not isinstance(node, torch.fx.Node):
                return False
            continue
        return isinstance(node.target, torch._ops.OpOverload) and only_allocates(node.target)


def reinplace_all_reduces(gm: torch.fx.GraphModule) -> None:
    if not torch.distributed.is_available():
        return
    c10d = torch.ops._c10d_functional
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not c10d.all_reduce.default or n.kwargs:
            continue
        x = n.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.is_contiguous() and dies_with(x, n):
            n.target = c10d.all_reduce_.default
            n.meta[REINPLACED] = True
