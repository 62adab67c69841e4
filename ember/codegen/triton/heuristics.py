"""Block sizes and warps for a kernel, from its shape (no autotuning yet)."""
from __future__ import annotations

import sympy

from ...ir.symbolic import hint


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def needs_int64(nodes, graph) -> bool:
    """Index arithmetic in int64 when any tensor the kernel touches spans 2**31 elements or more."""
    names = set().union(*(n.reads | n.writes for n in nodes))
    for name in names:
        try:
            buf = graph.get_buffer(name)
            if hint(buf.layout.storage_size()) >= 2 ** 31 - 1:
                return True
        except Exception:
            continue
    for n in nodes:
        x, r = n.group()
        if hint(x) * hint(r) >= 2 ** 31 - 1:
            return True
    return False


def launch_config(kernel) -> dict:
    X = max(1, hint(kernel.X))
    if not kernel.has_rdim:
        xblock = min(1024, next_pow2(X))
        warps = 4 if xblock >= 512 else (2 if xblock >= 128 else 1)
        return {"XBLOCK": xblock, "num_warps": warps}
    R = max(1, hint(kernel.R))
    if kernel.tiled:
        return {"XBLOCK": min(64, next_pow2(X)), "RBLOCK": min(64, next_pow2(R)), "num_warps": 4}
    if kernel.persistent:
        # whole rows in registers: several short rows per program, one long row per program
        rblock = next_pow2(R)
        xblock = max(1, min(next_pow2(X), 4096 // rblock, 64))
        if not _reads_rows_contiguously(kernel):
            xblock = max(xblock, min(32, next_pow2(X)))
        n = xblock * rblock
        warps = 2 if n <= 512 else 4 if n <= 2048 else 8 if n <= 8192 else 16
        return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps}
    if _reads_rows_contiguously(kernel):
        rblock = min(2048, next_pow2(R))
        return {"XBLOCK": 1, "RBLOCK": rblock, "num_warps": 8 if rblock >= 1024 else 4}
    return {"XBLOCK": min(64, next_pow2(X)), "RBLOCK": min(32, next_pow2(R)), "num_warps": 8}


def _reads_rows_contiguously(kernel) -> bool:
    """Do the kernel's loads walk memory along rindex (stride 1)? Then rows go one per program."""
    from ...schedule.nodes import RINDEX, canonical
    for n in kernel.nodes:
        subs = n.flat_vars(kernel.group)
        for d in n.read_deps:
            e = canonical(d.index, subs, kernel.group)
            if RINDEX in e.free_symbols:
                coeff = sympy.expand(e).coeff(RINDEX)
                return coeff == 1
    return True
