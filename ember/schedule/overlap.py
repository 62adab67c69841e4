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
communication library requires.

A collective in flight holds its inputs (the wait reads them: ir/collectives.py) and its outputs. The
bytes held by the collectives in flight are bounded by `config.overlap_memory_budget_bytes`:
  - a collective that would take them past the budget while others are in flight is issued later, once
    waits have made room (it is not eligible until then);
  - a collective larger than the whole budget is not hoisted (it is issued where the graph's order puts
    it) and is waited for right after it is issued.
Every decision depends on the graph alone: static sizes from the layouts (a collective holding a buffer of
symbolic size counts as larger than the budget: its size hint is this rank's example, which other ranks
need not share), ties broken by the graph's order, no timings, no rank, no iteration over hashed
collections whose order could differ between processes.
"""
from __future__ import annotations

import heapq
from typing import Callable, Optional

import sympy

from .. import config, state
from ..ir.collectives import CollectiveKernel, WaitKernel
from ..ir.nodes import Layout

ISSUE, FEEDS_ISSUE, OTHER, WAIT = range(4)


def _only(group, kind) -> bool:
    return len(group.nodes) == 1 and isinstance(group.nodes[0].buf, kind)


def static_nbytes(name: str) -> Optional[int]:
    """The bytes of buffer `name` of the graph being compiled; None for a symbolic size, 0 for a name that
    binds no memory of its own."""
    graph = state.current_graph()
    buf = graph.name_to_buffer.get(name, graph.graph_inputs.get(name))
    layout = getattr(buf, "layout", None)
    if not isinstance(layout, Layout):
        return 0
    size = sympy.sympify(layout.storage_size())
    return int(size) * layout.dtype.itemsize if size.is_Integer else None


def overlap_collectives(groups: list, nbytes: Callable[[str], Optional[int]] = static_nbytes,
                        budget: Optional[int] = None) -> list:
    """`groups` (fused groups in a valid execution order) reordered: collectives early, waits late, at
    most `budget` (default config.overlap_memory_budget_bytes) bytes in flight; `nbytes(buffer name)`."""
    if not any(_only(g, (CollectiveKernel, WaitKernel)) for g in groups):
        return groups
    budget = config.overlap_memory_budget_bytes if budget is None else budget
    position = {g: i for i, g in enumerate(groups)}
    issues = [g for g in groups if _only(g, CollectiveKernel)]
    group_of = {n: g for g in groups for n in g.nodes}
    preds = {g: {group_of[d] for n in g.nodes for d in n.deps if group_of.get(d) not in (None, g)} for g in groups}
    for earlier, later in zip(issues, issues[1:]):      # the collectives' own order
        preds[later].add(earlier)
    users: dict = {g: [] for g in groups}
    for g in groups:
        for p in sorted(preds[g], key=position.__getitem__):
            users[p].append(g)

    issue_of = {g.nodes[0].buf: g for g in issues}
    waits_of: dict = {g: [] for g in issues}        # a coalesced collective has a wait per tensor
    for g in groups:
        if _only(g, WaitKernel) and g.nodes[0].buf.issued_by in issue_of:
            waits_of[issue_of[g.nodes[0].buf.issued_by]].append(g)
    held_bytes = {c: _held_bytes(c, waits_of[c], nbytes, budget) for c in issues}
    feeds = _ancestors(issues, preds)

    def priority(g) -> int:
        if _only(g, CollectiveKernel) and held_bytes[g] <= budget:
            return ISSUE
        if _only(g, WaitKernel):
            return WAIT
        return FEEDS_ISSUE if g in feeds else OTHER

    in_flight: dict = {}             # collective -> its waits not yet run (insertion order: issue order)
    held = 0

    def eligible(g) -> bool:
        if held > budget:            # only a collective larger than the budget is in flight: wait for it
            return any(g in waits for waits in in_flight.values())
        if _only(g, CollectiveKernel):
            return not in_flight or held + held_bytes[g] <= budget
        return True

    indeg = {g: len(preds[g]) for g in groups}
    ready = [(priority(g), position[g], g) for g in groups if indeg[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        skipped = []
        while ready and not eligible(ready[0][2]):
            skipped.append(heapq.heappop(ready))
        # nothing eligible (the budget cannot be kept): the first by priority runs, so that all do
        entry = heapq.heappop(ready) if ready else skipped.pop(0)
        for s in skipped:
            heapq.heappush(ready, s)
        g = entry[2]
        order.append(g)
        if g in waits_of and waits_of[g]:
            in_flight[g] = list(waits_of[g])
            held += held_bytes[g]
        for c, waits in list(in_flight.items()):
            if g in waits:
                waits.remove(g)
                if not waits:
                    del in_flight[c]
                    held -= held_bytes[c]
        for u in users[g]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (priority(u), position[u], u))
    assert len(order) == len(groups), "overlap_collectives: the groups' dependencies have a cycle"
    return order


def _held_bytes(issue, waits: list, nbytes, budget: int) -> int:
    """Bytes a collective holds while in flight: its inputs and outputs (what its waits read and write);
    more than `budget` where one of them has a symbolic size."""
    names = set(issue.reads) | set(issue.writes)
    for w in waits:
        names |= w.reads | w.writes
    sizes = [nbytes(name) for name in sorted(names)]
    return budget + 1 if None in sizes else sum(sizes)


def _ancestors(groups: list, preds: dict) -> set:
    """The groups some group of `groups` depends on."""
    out = set()
    stack = [p for g in groups for p in preds[g]]
    while stack:
        g = stack.pop()
        if g not in out:
            out.add(g)
            stack.extend(preds[g])
    return out
