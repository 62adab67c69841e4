"""Memory planning: which buffers live only inside one kernel (never allocated), where each allocated
buffer is freed (right after its last reader), and which kernel outputs may be computed in place, in the
memory of an input the kernel reads for the last time."""
from __future__ import annotations

from ..ir.nodes import ComputedBuffer, MutationBuffer
from .fusion import _indirect_syms
from .nodes import canonical


def kernel_local_buffers(groups, output_names: set) -> dict:
    """group id -> names of buffers written and read only inside that group (no memory needed)."""
    where_read: dict[str, set] = {}
    for g in groups:
        for s in g.reads:
            where_read.setdefault(s, set()).add(g.id)
    local = {}
    for g in groups:
        names = set()
        for n in g.nodes:
            if not isinstance(n.buf, ComputedBuffer) or isinstance(n.buf, MutationBuffer):
                continue
            name = n.name
            if name in output_names:
                continue
            if where_read.get(name, set()) <= {g.id}:
                names.add(name)
        local[g.id] = names
    return local


def last_uses(groups) -> dict:
    """storage name -> index of the last group that reads or writes it."""
    last = {}
    for i, g in enumerate(groups):
        for s in g.reads | g.writes:
            last[s] = i
    return last


def can_overwrite(group, old: str, new: str) -> bool:
    """May `new`, written by this kernel, take the memory of `old`, which it reads for the last time?
    Only if the kernel touches both at one and the same element everywhere (and never through a
    run-time index), and `new`'s value is computed from `old`'s element: then each element of `old` is
    loaded by the thread that writes the same element of `new`, before it writes it (a later load of the
    same element in the same pass reuses that value), and by no other thread. In a kernel of several
    passes (a looped reduction's sections), no reader of `old` may run in a later pass than the writer
    of `new`: a reader depends on no reduction the writer does not depend on."""
    writer = next((n for n in group.nodes if n.name == new), None)
    if writer is None or old not in writer.reads:
        return False
    feeding = _reductions_feeding(group)
    readers = [n for n in group.nodes if old in n.reads]
    if any(not feeding[n.name] <= feeding[writer.name] for n in readers):
        return False
    indices = set()
    for n in group.nodes:
        deps = [d for d in n.read_deps + n.write_deps if d.name in (old, new)]
        if not deps:
            continue
        subs = n.flat_vars(group.group)
        if subs is None:
            return False
        for d in deps:
            e = canonical(d.index, subs, group.group)
            if _indirect_syms(e):
                return False
            indices.add(e)
    return len(indices) == 1


def _reductions_feeding(group) -> dict:
    """node name -> names of the group's reductions it depends on, directly or through group nodes."""
    by_name = {n.name: n for n in group.nodes}
    out: dict = {}
    for n in group.nodes:        # in order: producers come first
        feeds = set()
        for r in n.reads:
            m = by_name.get(r)
            if m is not None and m is not n:
                feeds |= out.get(m.name, set()) | ({m.name} if m.is_reduction() else set())
        out[n.name] = feeds
    return out
