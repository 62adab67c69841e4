"""Overlap communication with compute: within one graph, issue each collective as early as its inputs
allow and wait for it as late as its readers allow, so that kernels run while the collective is in flight.

The fused groups are put in a new topological order (every dependency kept) by list scheduling: of the
groups whose dependencies have run, the next is
  1. a collective (issued as soon as it is ready);
  2. else a group a collective still to be issued depends on (its inputs are computed first, ahead of
     work no collective waits for);
  3. else any other group but a wait;
  4. else a wait: only when nothing else can run, that is right before the first group that reads it;
each class in the graph's order. Collectives keep their order relative to each other: every rank runs the
same graph through the same pass, so every rank issues the same collectives in the same order, which the
communication library requires. The decisions depend on the graph alone (never on timings or the rank).

Issuing early keeps a collective's output allocated longer, and waiting late keeps its inputs (which the
wait reads: ir/collectives.py) alive longer; no memory budget bounds that yet.
"""
from __future__ import annotations

from ..ir.collectives import CollectiveKernel, WaitKernel
from .fusion import list_schedule

ISSUE, FEEDS_ISSUE, OTHER, WAIT = range(4)


def _only(group, kind) -> bool:
    return len(group.nodes) == 1 and isinstance(group.nodes[0].buf, kind)


def overlap_collectives(groups: list) -> list:
    """`groups` (fused groups in a valid execution order) reordered: collectives early, waits late."""
    if not any(_only(g, (CollectiveKernel, WaitKernel)) for g in groups):
        return groups
    issues = [g for g in groups if _only(g, CollectiveKernel)]
    group_of = {n: g for g in groups for n in g.nodes}
    preds = {g: {group_of[d] for n in g.nodes for d in n.deps if group_of.get(d) not in (None, g)} for g in groups}
    for earlier, later in zip(issues, issues[1:]):      # the collectives' own order
        preds[later].add(earlier)
    users: dict = {g: set() for g in groups}
    for g, ps in preds.items():
        for p in ps:
            users[p].add(g)

    feeds = set()                 # groups some collective depends on
    stack = [p for g in issues for p in preds[g]]
    while stack:
        g = stack.pop()
        if g not in feeds:
            feeds.add(g)
            stack.extend(preds[g])

    def priority(g) -> int:
        if _only(g, CollectiveKernel):
            return ISSUE
        if _only(g, WaitKernel):
            return WAIT
        return FEEDS_ISSUE if g in feeds else OTHER

    position = {g: i for i, g in enumerate(groups)}
    order = list_schedule(groups, users, lambda g: (priority(g), position[g]))
    assert len(order) == len(groups), "overlap_collectives: the groups' dependencies have a cycle"
    return order
