"""Fusion: merge scheduler nodes into kernels, best-first by bytes saved, to a fixpoint.

Two groups may fuse when they run on the same device, their iteration spaces fit one kernel (same
(xnumel, rnumel), or a pointwise node that splits into the reduction's rows), fusing them creates no
cycle through a third group, and every value one writes and the other reads is accessed at the same
element (so no thread reads what another thread of the kernel writes). A scatter (a ScatterBuffer, or
any store at positions loaded at run time) never shares a kernel with another reader or writer of its
buffer. A scan is a kernel of its own: its steps run in order along the r axis, which no other node of a
kernel expects. A template (a GEMM) takes in pointwise consumers of its output as its epilogue, nothing else.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Optional

from .. import config
from ..ir.nodes import ScatterBuffer
from ..ir.template import is_template
from ..ir.symbolic import hint, statically_known_equal
from .nodes import SchedulerNode, canonical


class FusedGroup:
    _ids = itertools.count()

    def __init__(self, nodes: list[SchedulerNode]):
        self.id = next(FusedGroup._ids)
        self.nodes = sorted(nodes, key=lambda n: n.order)
        self.alive = True
        self.group = _group_of(self.nodes)
        self.reads = set().union(*(n.reads for n in self.nodes))
        self.writes = set().union(*(n.writes for n in self.nodes))
        self.min_order = self.nodes[0].order
        self.max_order = self.nodes[-1].order

    def is_kernel(self) -> bool:
        return self.nodes[0].is_kernel()

    def is_reduction(self) -> bool:
        return self.group[1] != 1

    def device(self):
        return self.nodes[0].device()

    def template(self) -> Optional[SchedulerNode]:
        """The group's template node (at most one), or None."""
        return next((n for n in self.nodes if is_template(n.buf)), None)

    def __repr__(self):
        return f"FusedGroup({[n.name for n in self.nodes]}, group={self.group})"


# Below this many elements (X * R) a kernel's time is its launch: siblings of this size fuse for launches saved.
SIBLING_MAX_ELEMENTS = 1 << 16
# A kernel that nothing in the graph reads after it (a sink: it writes outputs, or into inputs) of at most this
# many elements, reading storages of at most TINY_READ_BYTES each, fuses with other such sinks of its (X, R),
# up to TINY_SINKS_PER_KERNEL of them: an optimizer step's per-parameter step counts, one element each.
TINY_MAX_ELEMENTS = 1024
TINY_READ_BYTES = 1 << 16
TINY_SINKS_PER_KERNEL = 64


def _small(g: FusedGroup) -> bool:
    n = hint(g.group[0]) * hint(g.group[1])
    return n <= SIBLING_MAX_ELEMENTS


def _group_of(nodes) -> tuple:
    for n in nodes:
        if n.is_reduction():
            return n.group()
    return nodes[0].group()


def merged_group(a: FusedGroup, b: FusedGroup) -> Optional[tuple]:
    """The (X, R) of a kernel holding both, or None."""
    if a.is_reduction() and b.is_reduction():
        ga, gb = a.group, b.group
        ok = statically_known_equal(ga[0], gb[0]) and statically_known_equal(ga[1], gb[1])
        return ga if ok else None
    red = a if a.is_reduction() else (b if b.is_reduction() else None)
    if red is None:
        return a.group if statically_known_equal(a.group[0], b.group[0]) else None
    other = b if red is a else a
    if all(n.split(red.group) is not None for n in other.nodes):
        return red.group
    return None


def build_nodes(buffers) -> list[SchedulerNode]:
    nodes = [SchedulerNode(b, i) for i, b in enumerate(buffers)]
    last_writer: dict[str, SchedulerNode] = {}
    readers: dict[str, list] = {}
    defined_by: dict = {}
    for n in nodes:
        n.deps.update(defined_by[s] for s in n.symbols if s in defined_by)
        for s in n.defined_symbols():
            defined_by[s] = n
        for s in n.reads:
            if s in last_writer and last_writer[s] is not n:
                n.deps.add(last_writer[s])
            readers.setdefault(s, []).append(n)
        for s in n.writes:
            n.deps.update(r for r in readers.get(s, []) if r is not n)
            if s in last_writer:
                n.deps.add(last_writer[s])
            last_writer[s] = n
            readers[s] = []
    for n in nodes:
        for d in n.deps:
            d.users.add(n)
    return nodes


class Fusion:
    def __init__(self, nodes: list[SchedulerNode], nbytes, varying=frozenset()):
        self.nbytes = nbytes          # storage name -> bytes, for scoring
        # storages read one element at a time, each element by its own op (Buffer.elements_vary: the seeds
        # of random ops): reading the same one saves no bytes, reading the same element saves a draw
        self.varying = frozenset(varying)
        self.group_of: dict[SchedulerNode, FusedGroup] = {}
        self.groups: list[FusedGroup] = []
        for n in nodes:
            self._add(FusedGroup([n]))
        # the edges between live groups (g -> the groups with a node that must run after one of g's), kept
        # up to date as groups merge: the legality checks walk them for every candidate pair
        self.users: dict[FusedGroup, set] = {
            g: {self.group_of[u] for n in g.nodes for u in n.users} - {g} for g in self.groups}
        self.preds: dict[FusedGroup, set] = {g: set() for g in self.groups}
        for g, users in self.users.items():
            for u in users:
                self.preds[u].add(g)

    def _add(self, g: FusedGroup):
        self.groups.append(g)
        for n in g.nodes:
            self.group_of[n] = g

    def _merge(self, a: FusedGroup, b: FusedGroup) -> FusedGroup:
        """One group in place of a and b; the edges of either are the merged group's."""
        merged = FusedGroup(a.nodes + b.nodes)
        a.alive = b.alive = False
        self._add(merged)
        pair = {a, b}
        users = (self.users.pop(a) | self.users.pop(b)) - pair
        preds = (self.preds.pop(a) | self.preds.pop(b)) - pair
        for p in preds:
            self.users[p] -= pair
            self.users[p].add(merged)
        for u in users:
            self.preds[u] -= pair
            self.preds[u].add(merged)
        self.users[merged], self.preds[merged] = users, preds
        return merged

    # -- legality ----------------------------------------------------------------------------------

    def group_users(self, g: FusedGroup) -> set:
        """The live groups that must run after g (not to be changed by the caller)."""
        return self.users[g]

    def creates_cycle(self, a: FusedGroup, b: FusedGroup) -> bool:
        """Is there a path a -> h -> ... -> b (or b -> ... -> a) through a third group h?"""
        for src, dst in ((a, b), (b, a)):
            # a group whose first node comes after dst's last one cannot lead back to dst
            last = dst.max_order
            stack = [h for h in self.users[src] if h is not dst and h.min_order <= last]
            seen = set(stack)
            while stack:
                users = self.users[stack.pop()]
                if dst in users:
                    return True
                for u in users:
                    if u not in seen and u.min_order <= last:
                        seen.add(u)
                        stack.append(u)
        return False

    def accesses_agree(self, a: FusedGroup, b: FusedGroup, group) -> bool:
        """Every storage one writes and the other touches is accessed at the same element."""
        nodes = a.nodes + b.nodes
        written = a.writes | b.writes
        shared = {s for s in written if s in (a.reads | a.writes) and s in (b.reads | b.writes)}
        for s in shared:
            indices = set()
            for n in nodes:
                subs = n.flat_vars(group)
                if subs is None:
                    return False
                for d in n.read_deps + n.write_deps:
                    if d.name == s:
                        indices.add(canonical(d.index, subs, group))
            if len(indices) > 1:
                return False
        return True

    def can_fuse(self, a: FusedGroup, b: FusedGroup) -> Optional[tuple]:
        if not (a.alive and b.alive and a.is_kernel() and b.is_kernel()) or a is b:
            return None
        if a.device() != b.device():
            return None
        if any(n.is_scan() for n in a.nodes + b.nodes):
            return None
        if not _template_fusion_allowed(a, b):
            return None
        group = merged_group(a, b)
        if group is None:
            return None
        if self._scatters_into(a, b) or self._scatters_into(b, a):
            return None
        if any(n.has_indirect for n in a.nodes + b.nodes) and (a.writes & b.reads or b.writes & a.reads):
            # an indirect read of a value written in the same kernel may cross threads
            if not self._indirect_safe(a, b):
                return None
        if not self.accesses_agree(a, b, group):
            return None
        if self.creates_cycle(a, b):
            return None
        return group

    def _scatters_into(self, a, b) -> bool:
        """Does a scatter in a (a store at run-time positions, or any ScatterBuffer: one whose positions
        are static can still be many elements to one, e.g. along a size-1 dim) write a buffer b reads or
        writes? Any thread may write any element, so b runs once the whole scatter has finished: never in
        its kernel."""
        touched = b.reads | b.writes
        return any(d.name in touched and (isinstance(n.buf, ScatterBuffer) or _indirect_syms(d.index))
                   for n in a.nodes for d in n.write_deps)

    def _indirect_safe(self, a, b) -> bool:
        for n in a.nodes + b.nodes:
            if n.has_indirect:
                other = b if n in a.nodes else a
                if any(d.name in other.writes and d.index.free_symbols & _indirect_syms(d.index)
                       for d in n.read_deps):
                    return False
        return True

    def score(self, a: FusedGroup, b: FusedGroup) -> int:
        shared = (a.writes & b.reads) | (b.writes & a.reads)
        vertical = sum(self.nbytes(s) for s in shared)
        horizontal = sum(self.nbytes(s) for s in (a.reads & b.reads) - self.varying) + self._shared_draws(a, b)
        if not config.horizontal_fusion and not shared:
            return 0
        return 2 * vertical + horizontal

    def _shared_draws(self, a: FusedGroup, b: FusedGroup) -> int:
        """What fusing saves of random draws: a seed both groups read (a random op's values computed in both:
        dropout's output and the mask saved for the backward) is drawn once in one kernel, scored as a
        float32 read over the smaller iteration space. Groups that read only other seeds of the same buffer
        share nothing (counted as sharing the buffer, every layer's dropout mask was drawn in the first
        layer's kernel, and the later layers read their masks back from memory)."""
        common = self.varying & a.reads & b.reads
        if not common:
            return 0

        def seeds(g):
            return {(d.name, d.index) for n in g.nodes for d in n.read_deps if d.name in common}
        drawn = len(seeds(a) & seeds(b))
        return drawn * 4 * min(hint(g.group[0]) * hint(g.group[1]) for g in (a, b))

    # -- the loop --------------------------------------------------------------------------------------

    def neighbours(self, g: FusedGroup, by_storage) -> set:
        out = set()
        for s in g.reads | g.writes:
            out.update(by_storage.get(s, ()))
        out.discard(g)
        return {h for h in out if h.alive}

    def run(self) -> list[FusedGroup]:
        if not config.fuse:
            return self.ordered()
        by_storage: dict[str, set] = {}

        def index(g):
            for s in g.reads | g.writes:
                by_storage.setdefault(s, set()).add(g)

        for g in self.groups:
            index(g)
        heap, tie = [], itertools.count()

        def push_pairs(g):
            for h in self.neighbours(g, by_storage):
                sc = self.score(g, h)
                if sc > 0:
                    heapq.heappush(heap, (-sc, min(g.min_order, h.min_order), next(tie), g, h))

        for g in list(self.groups):
            if g.is_kernel():
                push_pairs(g)
        while heap:
            _, _, _, a, b = heapq.heappop(heap)
            if not (a.alive and b.alive):
                continue
            if self.can_fuse(a, b) is None:
                continue
            merged = self._merge(a, b)
            index(merged)
            push_pairs(merged)
        self.fuse_small_siblings()
        self.fuse_tiny_sinks()
        return self.ordered()

    def fuse_small_siblings(self) -> None:
        """Kernels too small to be bound by anything but their launch, with the same (X, R) and one producer
        in common (the second steps of split reductions of one kernel's partials), share a kernel even
        though they share no bytes: one launch instead of several. Nearest first, greedily."""
        if not config.horizontal_fusion:
            return
        for p in sorted((g for g in self.groups if g.alive), key=lambda g: g.min_order):
            if not p.alive:
                continue
            kids = sorted((u for u in self.group_users(p) if u.alive and u.is_kernel() and _small(u)),
                          key=lambda g: g.min_order)
            for k in kids[1:]:
                if self.can_fuse(kids[0], k) is not None:
                    kids[0] = self._merge(kids[0], k)

    def fuse_tiny_sinks(self) -> None:
        """Tiny kernels that no other group waits for and that read only tiny storages share a kernel with
        others of their (X, R), though they share no bytes: one launch for many (a compiled optimizer step
        adds one to each parameter's step count). No group waits for a sink, so merging two delays nothing
        else, and the storages it keeps alive longer are tiny."""
        if not config.horizontal_fusion:
            return
        open_kernels: dict = {}        # (X, R) -> the merged sink being filled
        for g in sorted((g for g in self.groups if g.alive), key=lambda g: g.min_order):
            if not (g.alive and g.is_kernel() and not self.users[g] and self._tiny(g)):
                continue
            key = tuple(g.group)
            into = open_kernels.get(key)
            if into is not None and into.alive and len(into.nodes) < TINY_SINKS_PER_KERNEL and \
                    self.can_fuse(into, g) is not None:
                open_kernels[key] = self._merge(into, g)
            else:
                open_kernels[key] = g

    def _tiny(self, g: FusedGroup) -> bool:
        return hint(g.group[0]) * hint(g.group[1]) <= TINY_MAX_ELEMENTS and \
            all(self.nbytes(s) <= TINY_READ_BYTES for s in g.reads)

    def ordered(self) -> list[FusedGroup]:
        """Live groups in a topological order (by each group's first node where free to choose)."""
        live = [g for g in self.groups if g.alive]
        out = list_schedule(live, {g: self.group_users(g) for g in live}, lambda g: (g.min_order, g.id))
        assert len(out) == len(live), "fusion created a cycle"
        return out


def _template_fusion_allowed(a: FusedGroup, b: FusedGroup) -> bool:
    """A group holding a template (ir/template.py) takes in only pointwise consumers of what it computes
    (its epilogue): never another template, a reduction, or a producer of the template's operands."""
    ta, tb = a.template(), b.template()
    if ta is None and tb is None:
        return True
    if ta is not None and tb is not None:
        return False
    (t, template), other = ((a, ta), b) if ta is not None else ((b, tb), a)
    return not (other.is_reduction() or t.is_reduction()) and not (other.writes & template.reads) and \
        bool(other.reads & t.writes)


def list_schedule(groups: list, users: dict, key) -> list:
    """`groups` in a topological order of the edges group -> `users[group]`: of the groups whose
    predecessors have all run, the one with the smallest `key(group)` (unique per group) runs next. A
    cycle leaves its groups out."""
    indeg = {g: 0 for g in groups}
    for g in groups:
        for u in users[g]:
            indeg[u] += 1
    ready = [(key(g), g) for g in groups if indeg[g] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(g)
        for u in users[g]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (key(u), u))
    return out


def _indirect_syms(expr) -> set:
    return {s for s in expr.free_symbols if s.name.startswith("indirect")}
