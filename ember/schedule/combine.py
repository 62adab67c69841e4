"""Combined kernels: independent small pointwise kernels launched as one.

An optimizer step updates each parameter in a kernel of its own (graph/foreach.py fuses each parameter's
whole update into one): 77 launches for a Llama-style model's 75 parameters. None of them reads what
another writes, and each is small, so its time is its launch. Consecutive groups like these become the
parts of one combined kernel: each part runs its own iteration space on a range of the launch's programs
(the backend renders it: `KernelBackend.combines_kernels`).

A part is a pointwise kernel group of a static size up to COMBINED_MAX_ELEMENTS (its block count is part of
the combined kernel's source) whose nodes use no size symbols; a random op's seed position, a parameter of
its own kernel, is one of the combined kernel's (a dropout's keep flags beside weight casts). Parts of one
combined kernel are independent: none reads or writes a buffer another part writes, so the parts may run in
any order, at once.

Eligible groups that stand apart, each between two library calls, are first gathered
(`gather_combinable`): such a group moves up to the previous eligible group where nothing in between
depends on it or writes what it reads, so that a forward's weight casts under autocast (one per linear
layer, each right before its product) become runs of their own. A group moved up holds its outputs longer,
so the outputs moved up to one place are bounded by GATHER_MAX_BYTES.

Runs of eligible groups are cut into combined kernels of at most COMBINED_MAX_PARTS parts and
COMBINED_MAX_POINTERS distinct buffers. Where the run repeats (the same layer's parameters again), the cut
follows the repetition so that every layer's combined kernel has the same structure and they share one
compiled kernel (schedule/structure.py).
"""
from __future__ import annotations

from typing import Callable, Hashable, Optional

from ..device import backend_for
from ..ir.symbolic import is_static

# parts per combined kernel: each is one more branch of the kernel's source, compiled together
COMBINED_MAX_PARTS = 16
# distinct buffers a combined kernel takes (its launch's parameter space stays small)
COMBINED_MAX_POINTERS = 96
# elements of a part's iteration space: past this a kernel's time is its memory traffic, not its launch, and
# every part's outputs are allocated before the combined launch and its inputs freed after it, so large parts
# would raise the peak. The weights of the benchmark models' MLPs (3072 x 768, 2816 x 1024: their casts under
# autocast, their optimizer updates) stay under it.
COMBINED_MAX_ELEMENTS = 1 << 22
# bytes of output the groups moved up to one place may hold before the place they stood: the most a
# gathering adds to the memory in use at any point of the program
GATHER_MAX_BYTES = 64 << 20


class CombinedGroup:
    """Groups launched as one kernel: `parts`, in program order, each with its own iteration space. It
    stands for them where the program builder asks a kernel's group for its nodes (names, checks) or its
    iteration space (traffic estimates: one element per position of every part)."""

    def __init__(self, parts: list):
        self.parts = list(parts)
        self.nodes = [n for p in self.parts for n in p.nodes]
        self.group = (sum(p.group[0] for p in self.parts), 1)

    def device(self):
        return self.parts[0].device()

    def __repr__(self):
        return f"CombinedGroup({self.parts})"


def combinable(group) -> bool:
    """May this group be a part of a combined kernel? (whether its backend renders them is asked apart)"""
    return (group.is_kernel() and not group.is_reduction() and group.template() is None
            and is_static(group.group[0]) and int(group.group[0]) <= COMBINED_MAX_ELEMENTS
            and not any(n.is_scan() or n.symbols for n in group.nodes))


def eligible(group) -> bool:
    """May this group be a part of a combined kernel on its device?"""
    return combinable(group) and backend_for(group.device()).combines_kernels


def gather_combinable(groups: list, nbytes: Callable[[str], Optional[int]], is_eligible=eligible) -> list:
    """`groups` (in a valid execution order) reordered: each eligible group moves up to just after the
    eligible groups gathered last, past groups none of which it depends on (a read of their writes, a
    write of their reads or writes, a size they define: the scheduler nodes' deps), while the outputs moved
    up to that place stay within GATHER_MAX_BYTES (`nbytes(buffer name)`, None for a symbolic size). A
    group that does not move opens the next gathering where it stands."""
    index = {n: i for i, g in enumerate(groups) for n in g.nodes}
    out: list = []
    end = None              # position in `out` just past the open gathering
    passed: set = set()     # indices (in `groups`) of the groups after the open gathering
    held = 0
    for i, g in enumerate(groups):
        if not is_eligible(g):
            out.append(g)
            if end is not None:
                passed.add(i)
        elif end is not None and not passed:        # right after the gathering: it joins it where it stands
            out.append(g)
            end += 1
        else:
            moved = None if end is None else _bytes_moved_up(g, index, passed, nbytes, GATHER_MAX_BYTES - held)
            if moved is not None:
                out.insert(end, g)
                end += 1
                held += moved
            else:                                   # it opens the next gathering where it stands
                out.append(g)
                end, passed, held = len(out), set(), 0
    return out


def _bytes_moved_up(group, index: dict, passed: set, nbytes, room: int) -> Optional[int]:
    """The bytes of `group`'s outputs if it may move before the groups at `passed` (indices in `index`'s
    order), those outputs taking at most `room` bytes; None if it may not."""
    sizes = [nbytes(w) for w in group.writes]
    if None in sizes or sum(sizes) > room:
        return None
    if any(index[d] in passed for n in group.nodes for d in n.deps if d in index):
        return None
    return sum(sizes)


def combined_units(groups: list, eligible: Callable[[object], bool],
                   key: Callable[[object], Optional[Hashable]]) -> list[list[int]]:
    """The groups' indices, in order, cut into units: a unit of several indices is one combined kernel, a
    unit of one is launched as before. `eligible(group)`: the group may be a part; `key(group)`: its
    structural key (None if it has none), for cutting repeated runs alike."""
    units: list[list[int]] = []
    run: list[int] = []
    reads: set = set()
    writes: set = set()

    def flush():
        units.extend(_cut(run, [key(groups[i]) for i in run], groups) if len(run) > 1 else [[i] for i in run])
        run.clear()
        reads.clear()
        writes.clear()

    for i, g in enumerate(groups):
        if not eligible(g):
            flush()
            units.append([i])
            continue
        if run and (g.writes & (reads | writes) or g.reads & writes or g.device() != groups[run[0]].device()):
            flush()
        run.append(i)
        reads |= g.reads
        writes |= g.writes
    flush()
    return units


def _cut(run: list[int], keys: list, groups: list) -> list[list[int]]:
    """A run of independent eligible groups -> combined kernels. Where the run repeats with period p after
    a prefix, that stretch is cut at multiples of p, so that the repeated kernels have equal structure."""
    if not run:
        return []
    start, period, length = _repetition(keys)
    if period is None:
        chunks = [run[j:j + COMBINED_MAX_PARTS] for j in range(0, len(run), COMBINED_MAX_PARTS)]
        end = len(run)
    else:
        size = period * max(1, COMBINED_MAX_PARTS // period)
        end = start + length // period * period
        chunks = [run[:start]] if start else []
        chunks += [run[j:min(j + size, end)] for j in range(start, end, size)]
    units = [u for chunk in chunks for u in _within_pointers(chunk, groups)]
    return units + _cut(run[end:], keys[end:], groups)


def _repetition(keys: list) -> tuple[int, Optional[int], int]:
    """(prefix length, period, length of the periodic stretch after the prefix) for the shortest prefix and
    then the shortest period, both at most COMBINED_MAX_PARTS, whose stretch holds two periods at least;
    (0, None, 0) where there is none (or some group has no key)."""
    n = len(keys)
    for start in range(min(n, COMBINED_MAX_PARTS)):
        for period in range(1, COMBINED_MAX_PARTS + 1):
            if n - start < 2 * period:
                break
            i = start
            while i + period < n and keys[i] is not None and keys[i] == keys[i + period]:
                i += 1
            if i - start >= period:         # keys[start:i + period] repeat with this period
                return start, period, i + period - start
    return 0, None, 0


def _within_pointers(chunk: list[int], groups: list) -> list[list[int]]:
    """`chunk` split where its distinct buffers would pass COMBINED_MAX_POINTERS."""
    out: list[list[int]] = [[]]
    seen: set = set()
    for i in chunk:
        touched = groups[i].reads | groups[i].writes
        if out[-1] and len(seen | touched) > COMBINED_MAX_POINTERS:
            out.append([])
            seen = set()
        out[-1].append(i)
        seen |= touched
    return [c for c in out if c]
