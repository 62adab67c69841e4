"""The peak of a wrapper program's memory plan: walking its lines in order, the bytes of the memory it holds
(its Allocates and the fresh results of its extern calls, until the last name bound to that memory is
dropped), the line where that sum is largest and what is live there. Graph inputs and constants are the
caller's memory and are not counted; returned values are (they stay live to the end). An extern call's
own workspace is invisible to the wrapper and not counted either.

Eager PyTorch frees each intermediate when its last reference dies, so a plan whose peak is above eager's
keeps something eager does not: `describe` names the buffers live at the peak, with the FX nodes they come
from, to find it (the debug summary of each compiled graph has it, EMBER_DEBUG=1)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ..graph.passes.common import only_allocates
from ..ir.symbolic import hint
from .wrapper.lines import Allocate, CallExtern, Free, MultiOutputLine, Name, Reuse, View


@dataclasses.dataclass
class PlannedPeak:
    bytes: int                 # the most bytes the plan holds at once
    line: int                  # the index in program.lines of the first line after which it holds them
    live: list                 # [(a wrapper name bound to each memory live there, its bytes)], largest first


class _Plan:
    """Memories (each an id with its bytes) and the wrapper names bound to them."""

    def __init__(self):
        self.size: dict = {}       # memory id -> bytes
        self.holders: dict = {}    # memory id -> names bound to it
        self.bound: dict = {}      # name -> memory ids it holds (a view or a tuple may hold several)
        self.held = 0

    def new(self, name: str, nbytes: int) -> set:
        m = len(self.size)
        self.size[m], self.holders[m] = nbytes, set()
        self.held += nbytes
        self.bind(name, {m})
        return {m}

    def bind(self, name: str, memories: set):
        self.drop(name)
        self.share(name, memories)

    def share(self, name: str, memories: set):
        """`name` holds `memories` too (a tuple holds each of its results)."""
        self.bound.setdefault(name, set()).update(memories)
        for m in memories:
            self.holders[m].add(name)

    def drop(self, name: str):
        for m in self.bound.pop(name, ()):
            self.holders[m].discard(name)
            if not self.holders[m]:
                self.held -= self.size[m]

    def memories_of(self, values) -> set:
        """The memories the wrapper names among `values` (nested in lists, tuples and dicts) are bound to."""
        out: set = set()
        for v in values.values() if isinstance(values, dict) else values:
            if isinstance(v, (list, tuple, dict)):
                out |= self.memories_of(v)
            elif isinstance(v, Name):
                out |= self.bound.get(v, set())
        return out

    def live(self) -> list:
        rows = [(min(self.holders[m]), self.size[m]) for m in self.size if self.holders[m]]
        return sorted(rows, key=lambda r: (-r[1], r[0]))


def planned_peak(program, nbytes: Callable[[str], int]) -> PlannedPeak:
    """The peak of `program`'s plan; `nbytes(name)`: the bytes of the memory an allocation or extern call
    result `name` (or a MultiOutput of it) holds, from its layout (0 for a tuple)."""
    best = PlannedPeak(0, -1, [])
    for i, plan in _walk(program.lines, nbytes):
        if plan.held > best.bytes:
            best = PlannedPeak(plan.held, i, plan.live())
    return best


def held_bytes(lines: list, nbytes: Callable[[str], int]) -> list:
    """The bytes the plan holds after each of `lines`."""
    return [plan.held for _, plan in _walk(lines, nbytes)]


def _walk(lines: list, nbytes: Callable[[str], int]):
    """(index, the plan after that line) for each line."""
    plan = _Plan()
    fresh_parents: set = set()     # tuple-returning extern calls whose results are fresh memory
    for i, ln in enumerate(lines):
        if isinstance(ln, Allocate):
            plan.new(ln.name, nbytes(ln.name))
        elif isinstance(ln, Reuse):
            plan.bind(ln.name, plan.bound.get(ln.old, set()))
            if ln.release_old:
                plan.drop(ln.old)
        elif isinstance(ln, CallExtern) and ln.name is not None:
            if only_allocates(ln.op):
                plan.new(ln.name, nbytes(ln.name))
                fresh_parents.add(ln.name)
            else:   # a view of (or an update to) its arguments: holds what they hold
                plan.bind(ln.name, plan.memories_of(list(ln.args) + list(ln.kwargs.values())))
        elif isinstance(ln, MultiOutputLine):
            if ln.parent in fresh_parents:
                plan.share(ln.parent, plan.new(ln.name, nbytes(ln.name)))
            else:
                plan.bind(ln.name, plan.bound.get(ln.parent, set()))
        elif isinstance(ln, View):
            plan.bind(ln.name, plan.bound.get(ln.base, set()))
        elif isinstance(ln, Free):
            for name in ln.names:
                plan.drop(name)
        yield i, plan


@dataclasses.dataclass
class HeldForReuse:
    """A dead buffer's memory held from its Free line (`free`, which no longer names it) until `reuse` gives
    it to a new buffer; `allocate` is the line that allocates the new buffer instead."""
    reuse: Reuse
    free: Free
    allocate: Allocate


def drop_reuses_that_raise_the_peak(lines: list, reuses: list, nbytes: Callable[[str], int]) -> None:
    """Eager's allocator frees a tensor when it dies and serves later tensors from what was freed; a wrapper
    that holds a dead buffer for a later buffer of its layout holds its memory meanwhile, through whatever
    the lines between allocate. Keep each reuse (in program order) only where the plan's peak without any
    reuse stays the peak with it; free the others when they die and allocate their successors instead."""
    if not reuses:
        return
    at = {id(ln): i for i, ln in enumerate(lines)}
    for r in reuses:                 # the plan without reuses: each dead buffer freed when it dies
        r.free.names.append(r.reuse.old)
        lines[at[id(r.reuse)]] = r.allocate
    held = held_bytes(lines, nbytes)
    peak = max(held)
    for r in reuses:
        start, end = at[id(r.free)], at[id(r.reuse)]
        size = nbytes(r.reuse.old)
        if max(held[start:end], default=0) + size <= peak:
            r.free.names.remove(r.reuse.old)
            lines[end] = r.reuse
            held[start:end] = [h + size for h in held[start:end]]



def _live_rows(peak: PlannedPeak, origin: Optional[Callable[[str], str]]) -> list:
    from ..report.html import bytes_text
    return [f"{origin(n) if origin else n} {bytes_text(b)}" for n, b in peak.live]


def describe(peak: PlannedPeak, origin: Optional[Callable[[str], str]] = None, top: int = 8) -> str:
    """'planned peak: 12.00 MiB after line 40, live there: buf3 (FX node mm) 8.00 MiB, ...'"""
    from ..report.html import bytes_text
    rows = _live_rows(peak, origin)
    more = f", and {len(rows) - top} more" if len(rows) > top else ""
    return f"planned peak: {bytes_text(peak.bytes)} after line {peak.line}, live there: " \
           f"{', '.join(rows[:top])}{more}"


def buffer_bytes(lowering) -> Callable[[str], int]:
    """name -> the bytes of the storage of the lowering's buffer `name` (0 for one without a layout)."""
    def nbytes(name: str) -> int:
        try:
            layout = lowering.get_buffer(name).layout
        except KeyError:
            return 0
        return 0 if layout is None else int(hint(layout.storage_size())) * layout.dtype.itemsize
    return nbytes


def summary(program, lowering) -> str:
    """The debug dump's memory_plan.txt: the plan's peak and what is live there, each buffer with the FX
    node and user source line it comes from."""
    from .nan_checks import ValueOrigins
    origins = ValueOrigins(lowering)

    def origin(name: str) -> str:
        try:
            return origins.describe(name, lowering.get_buffer(name))
        except KeyError:
            return name
    from ..report.html import bytes_text
    peak = planned_peak(program, buffer_bytes(lowering))
    rows = "".join(f"  {r}\n" for r in _live_rows(peak, origin))
    return f"planned peak: {bytes_text(peak.bytes)} after line {peak.line}\nlive there:\n{rows}"
