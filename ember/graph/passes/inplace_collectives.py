"""An all-reduce whose input dies with it reduces that input in place.

`_c10d_functional.all_reduce(x)` returns a fresh tensor: ATen's functional op clones x (an allocation and
a device copy) and reduces the clone in place. Tensor parallelism's row-parallel products issue one per
projection, forward and backward, each on a product nothing else reads: the clone is pure cost, on the
device and on the host (an FSDP x TP Llama step's all-reduces took about twice the host time of in-place
ones). Where x's memory belongs to this graph and nothing but the all-reduce reads it, the call becomes
`all_reduce_(x)`, whose result is x's buffer (lowering/collectives.py).

x qualifies when, following it back through the ops that return a view of their input, every node on the
way has that one reader, and the chain starts at an op that returns fresh memory (not a graph input, not
an alias of one, not a tensor the graph returns or reads again). The decision depends on the graph alone:
every rank makes the same.
"""
from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

REINPLACED = "ember_reinplaced"    # node.meta key: an all_reduce_ this pass made (its lowering may copy)

# ops that return a view of their first input though their schema does not say so
_UNANNOTATED_VIEWS = {aten._unsafe_view.default, aten.reshape.default, aten.contiguous.default}


def _returns_view(target) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return target in _UNANNOTATED_VIEWS or bool(returns and returns[0].alias_info is not None)


def _returns_fresh(target) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not schema.is_mutable and target not in _UNANNOTATED_VIEWS and \
        all(r.alias_info is None for r in schema.returns)


def dies_with(x: torch.fx.Node, reader: torch.fx.Node) -> bool:
    """Whether x's memory is the graph's own and `reader` is the last (the only) thing to read it."""
    node, user = x, reader
    while True:
        if node.op != "call_function" or set(node.users) != {user}:
            return False
        if _returns_view(node.target):
            node, user = node.args[0], node
            if not isinstance(node, torch.fx.Node):
                return False
            continue
        return _returns_fresh(node.target)


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
