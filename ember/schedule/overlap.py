"""Overlap communication with compute: within one graph, issue each collective as early as its inputs
allow and wait for it as late as its first reader allows, so the kernels in between run while the
collective is in flight.

The pass moves groups within the fused groups' execution order and never breaks a dependency: a
collective goes right after the last group it depends on, a wait right before the first group that depends
on it (or last, when only the graph's output reads it). Collectives keep their order relative to each
other: every rank runs the same graph through the same pass, so every rank issues the same collectives in
the same order, which the communication library requires. The decisions depend on the graph alone (never
on timings or on the rank). Waits may complete in any order.

Moving a collective earlier keeps its output allocated longer, and moving a wait later keeps the
collective's inputs (which the wait reads: ir/collectives.py) alive longer; no memory budget bounds that
yet.
"""
from __future__ import annotations

from ..ir.collectives import CollectiveKernel, WaitKernel


def _only(group, kind) -> bool:
    return len(group.nodes) == 1 and isinstance(group.nodes[0].buf, kind)


def overlap_collectives(groups: list) -> list:
    """`groups` (fused groups in a valid execution order) reordered: collectives early, waits late."""
    issues = [g for g in groups if _only(g, CollectiveKernel)]
    waits = [g for g in groups if _only(g, WaitKernel)]
    if not issues and not waits:
        return groups
    group_of = {n: g for g in groups for n in g.nodes}
    preds = {g: {group_of[d] for n in g.nodes for d in n.deps if group_of.get(d) not in (None, g)} for g in groups}
    order = list(groups)

    previous = None
    for g in issues:
        order.remove(g)
        at = max((order.index(p) + 1 for p in preds[g] | ({previous} if previous else set())), default=0)
        order.insert(at, g)
        previous = g

    users: dict = {g: set() for g in groups}
    for g, ps in preds.items():
        for p in ps:
            users[p].add(g)
    for g in reversed(waits):
        order.remove(g)
        order.insert(min((order.index(u) for u in users[g]), default=len(order)), g)
    return order
