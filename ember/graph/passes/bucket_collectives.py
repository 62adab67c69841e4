"""Bucketing: independent functional collectives of one kind on one process group merged into one, so that
many small messages (FSDP2's per-parameter all-gathers, a backward's gradient all-reduces) travel as one.

A bucket's inputs are copied into one flat buffer, one collective runs on it, and its result is cut back
into the tensors the separate collectives returned. Per kind, with W ranks and tensors x_1 .. x_k (n_i
elements each):
  - all_reduce (one reduce op): cat(x_i flat) -> all_reduce -> element ranges, viewed as x_i's shapes;
  - all_gather_into_tensor (dim 0): cat(x_i flat) of S elements -> all_gather -> W * S elements laid out
    [rank][tensor]: viewed as [W, S], tensor i is columns [o_i, o_i + n_i), copied to [W * d0_i, ...] (each
    rank's x_i, in rank order: what the separate all-gather returns);
  - reduce_scatter_tensor (dim 0, one reduce op): rank r receives the r-th of W equal chunks of its input,
    so each x_i is viewed as [W, n_i / W] (row r: the chunk rank r receives) and the rows concatenated,
    cat(dim 1) -> [W, sum n_i / W] flat -> reduce_scatter -> sum n_i / W elements, cut into ranges of
    n_i / W viewed as the separate results' shapes.

Collectives are taken in graph order, greedily, into one open bucket per (kind, reduce op, group, dtype,
device) up to `config.collective_bucket_bytes` of input. A collective that depends (through any path) on a
member of an open bucket closes that bucket first: merged, its members would wait for each other's inputs
and outputs in a cycle. With that rule an edge between merged buckets always runs from the bucket whose
last member is earlier to the one whose last member is later, so the merged graph has no cycle. Only a
collective whose one user is its wait, on a tensor of static size, is bucketed; an op that mutates a
tensor closes every open bucket (the merged collective reads its inputs where its last member stood). The decisions depend on the
graph alone (its order and its values' sizes): every rank buckets alike.
"""
from __future__ import annotations

import heapq

import torch
import torch.fx

from ... import config, metrics
from ..pattern import fill_fake_values

aten = torch.ops.aten


def _kinds() -> dict:
    """collective op -> the indices of its arguments that must match for two calls to share a bucket."""
    if not torch.distributed.is_available():
        return {}
    c10d = torch.ops._c10d_functional
    return {c10d.all_reduce.default: (1, 2), c10d.all_gather_into_tensor.default: (1, 2),
            c10d.reduce_scatter_tensor.default: (1, 2, 3)}


def _is_collective(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and getattr(n.target, "namespace", None) == "_c10d_functional" and \
        n.target is not torch.ops._c10d_functional.wait_tensor.default


def _mutates(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable


def _bucket_key(n: torch.fx.Node, kinds: dict):
    """(kind, matching arguments, dtype, device) and the input's bytes, or None if `n` is not bucketed."""
    if n.target not in kinds or n.kwargs or len(n.users) != 1:
        return None
    (wait,) = n.users
    x = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
    if wait.target is not torch.ops._c10d_functional.wait_tensor.default or not isinstance(x, torch.Tensor) or \
            not all(isinstance(s, int) for s in x.shape) or x.numel() == 0:
        return None
    if n.target is torch.ops._c10d_functional.reduce_scatter_tensor.default and x.shape[0] % n.args[2]:
        return None
    key = (str(n.target), *(str(n.args[i]) for i in kinds[n.target]), str(x.dtype), str(x.device))
    return key, x.numel() * x.element_size()


def plan_buckets(gm: torch.fx.GraphModule, cap: int) -> list:
    """The collectives of `gm` to merge: lists of 2 or more collective nodes, in graph order."""
    kinds = _kinds()
    upstream: dict = {}      # node -> bit mask of the collectives it depends on (bit i: the i-th collective)
    bit: dict = {}
    open_buckets: dict = {}  # key -> [members, their bits, input bytes]   (insertion order: graph order)
    closed = []
    for n in gm.graph.nodes:
        mask = 0
        for a in n.all_input_nodes:
            mask |= upstream[a]
        if _mutates(n):       # a bucket reads its inputs after its last member: none may change before
            closed.extend(b[0] for b in open_buckets.values())
            open_buckets.clear()
        if _is_collective(n):
            for key in [k for k, b in open_buckets.items() if b[1] & mask]:
                closed.append(open_buckets.pop(key)[0])
            found = _bucket_key(n, kinds)
            if found is not None:
                key, size = found
                if key in open_buckets and open_buckets[key][2] + size > cap:
                    closed.append(open_buckets.pop(key)[0])
                if size <= cap:
                    b = open_buckets.setdefault(key, [[], 0, 0])
                    b[0].append(n)
                    b[1] |= 1 << len(bit)
                    b[2] += size
            bit[n] = 1 << len(bit)
            mask |= bit[n]
        upstream[n] = mask
    closed.extend(b[0] for b in open_buckets.values())
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    return sorted((b for b in closed if len(b) > 1), key=lambda b: position[b[0]])


def bucket_collectives(gm: torch.fx.GraphModule) -> None:
    cap = config.collective_bucket_bytes
    if cap <= 0 or not torch.distributed.is_available():
        return
    buckets = plan_buckets(gm, cap)
    if not buckets:
        return
    new_nodes = []
    for members in buckets:
        new_nodes += _merge(gm.graph, members)
        metrics.collective_buckets += 1
        metrics.collectives_bucketed += len(members)
    stable_topological_sort(gm.graph)
    fill_fake_values(gm, new_nodes)


def _merge(graph: torch.fx.Graph, members: list) -> list:
    """Replace `members` (collectives of one bucket, each waited for by its one user) by one collective on
    their concatenated inputs, right after the last of them. Returns the nodes created."""
    c10d = torch.ops._c10d_functional
    op = members[0].target
    xs = [m.args[0] for m in members]
    vals = [x.meta["val"] for x in xs]
    numels = [v.numel() for v in vals]
    created = []

    def call(target, *args, **kwargs):
        created.append(graph.call_function(target, args, kwargs))
        return created[-1]

    with graph.inserting_before(members[-1].next):
        if op is c10d.reduce_scatter_tensor.default:
            world = members[0].args[2]
            rows = [call(aten.reshape.default, x, [world, k // world]) for x, k in zip(xs, numels)]
            flat = call(aten.view.default, call(aten.cat.default, rows, 1), [-1])
            sizes = [k // world for k in numels]
        else:
            flat = call(aten.cat.default, [call(aten.reshape.default, x, [-1]) for x in xs])
            sizes = numels
        done = call(c10d.wait_tensor.default, call(op, flat, *members[0].args[1:]))
        if op is c10d.all_gather_into_tensor.default:
            world = members[0].args[1]
            done = call(aten.view.default, done, [world, sum(numels)])
        offset = 0
        for m, v, k in zip(members, vals, sizes):
            (wait,) = m.users
            shape = list(wait.meta["val"].shape)
            if op is c10d.all_gather_into_tensor.default:
                part = call(aten.slice.Tensor, done, 1, offset, offset + k)
                part = call(aten.clone.default, part, memory_format=torch.contiguous_format)
            else:
                part = call(aten.slice.Tensor, done, 0, offset, offset + k)
            offset += k
            wait.replace_all_uses_with(call(aten.view.default, part, shape))
    for m in members:
        (wait,) = m.users
        graph.erase_node(wait)
        graph.erase_node(m)
    return created


def stable_topological_sort(graph: torch.fx.Graph) -> None:
    """Reorder `graph`'s nodes so that each follows its inputs, keeping the present order where it is valid
    (of the nodes whose inputs are placed, the earliest goes next)."""
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(n.all_input_nodes) for n in nodes}
    ready = [(position[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for u in n.users:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (position[u], u))
    assert len(order) == len(nodes), "stable_topological_sort: the graph has a cycle"
    if order == nodes:
        return
    output = order[-1]
    for n in order[:-1]:
        output.prepend(n)
