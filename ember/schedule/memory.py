"""Memory planning: which buffers live only inside one kernel (never allocated), and where each
allocated buffer is freed (right after its last reader)."""
from __future__ import annotations

from ..ir.nodes import ComputedBuffer, MutationBuffer


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
