"""Common subexpression elimination on AOTAutograd's joint graph, before it is partitioned.

The joint graph computes some values twice (a decomposition's forward and its backward formula both take
`x.float()`, `rsqrt(var + eps)`, a shape's `expand`), and the min-cut partition decides what the backward
recomputes from one node per value. torch's partitioner merges such duplicates itself (`fx_graph_cse`, under
`torch._functorch.config.cse`), but that pass imports inductor's pattern matcher, and with it inductor's
lowerings: 0.3 s of a cold process on the CPU box, 1.5 s on the device hosts, whose torch has no bytecode
cache. ember merges them here and turns torch's pass off for its partition (graph/passes/partition.py).

Two nodes merge when they call the same op on the same arguments (the nodes among them merged first),
between the same mutations, and the op is deterministic and functional. Kept apart, as torch keeps them:
random ops and uninitialized allocations (`empty`), nodes a pass marks `KEEP_APART`, ops that mutate or
have effects, nodes whose storage a graph output returns (two equal outputs stay two tensors, as in eager),
and nodes that produce symbolic sizes (their metadata names an unbacked symbol the merged node would not).
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten

# node.meta key: a node a joint pass wants computed on its own, not merged with its equal (the forward's
# unpacking of a packed dropout mask: merged with the backward's, the partition would save the unpacked
# bytes, since torch's partitioner does not recompute bitwise ops)
KEEP_APART = "cse_keep_apart"

# allocations whose contents are undefined: two are two buffers
_UNINITIALIZED = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                  aten.new_empty.default, aten.new_empty_strided.default}


class _Unkeyable(Exception):
    """An argument with no value-based key (a SymInt, an object of unknown identity): the node stays."""


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merge duplicate nodes of `gm` in place; returns how many were removed."""
    graph = gm.graph
    kept_apart = _returned_storage_nodes(graph)
    region, seen, merged = 0, {}, 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if _mutates(node):
            region += 1       # a duplicate after a mutation may read what it changed
            continue
        if node in kept_apart or not _mergeable(node):
            continue
        try:
            key = (region, node.target, _key(node.args), _key(node.kwargs))
        except _Unkeyable:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
    if merged:
        gm.recompile()
    return merged


def _mergeable(node: torch.fx.Node) -> bool:
    if node.meta.get(KEEP_APART):
        return False
    target = node.target
    if target is operator.getitem:
        return isinstance(node.meta.get("val"), torch.Tensor)
    if not isinstance(target, torch._ops.OpOverload) or target in _UNINITIALIZED:
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    val = node.meta.get("val")
    values = val if isinstance(val, (tuple, list)) else (val,)
    # a backward op's gradients it was not asked for are None
    return any(isinstance(v, torch.Tensor) for v in values) and \
        all(v is None or isinstance(v, torch.Tensor) for v in values)


def _mutates(node: torch.fx.Node) -> bool:
    """An op that writes an argument or has effects beyond its result (an unknown callable counts)."""
    target = node.target
    if target is operator.getitem:
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return not _is_pure_python(target)


def _is_pure_python(target) -> bool:
    # size arithmetic and the like (operator.mul on SymInts, math.ceil, torch.sym_max)
    return getattr(target, "__module__", None) in ("_operator", "operator", "math") or \
        target in (torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not)


def _key(value):
    """A hashable key equal for equal arguments: a node by identity (duplicates were replaced before
    their users), scalars with their type (1, 1.0 and True differ; so do 0.0 and -0.0)."""
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, float):
        return ("float", repr(value))
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value).__name__, value)
    raise _Unkeyable(type(value).__name__)


def _returned_storage_nodes(graph: torch.fx.Graph) -> set:
    """Nodes whose value shares storage with a value the graph returns."""
    def storage(node):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        try:
            return StorageWeakRef(val.untyped_storage())
        except (NotImplementedError, RuntimeError):
            return None
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = {s for s in (storage(n) for n in output.all_input_nodes) if s is not None}
    return {n for n in graph.nodes if n.op != "output" and storage(n) in returned}
