"""Tiling: a pointwise kernel whose accesses are contiguous along different dimensions (a transpose), or
all along one dim that is not its last (channels-last buffers in NCHW order), iterates over 2-D tiles, so
that both its loads and its stores walk memory contiguously.

The tile splits each node's dims at one point: outer dims are the kernel's x axis, inner dims its
second axis (the same split a reduction kernel uses for rows and row elements)."""
from __future__ import annotations

from typing import Optional

import sympy

from ..ir.symbolic import hint, product, simplify_index, statically_known_equal


def _contiguous_dim(expr, ivars) -> Optional[int]:
    """The loop dim along which expr moves by 1 (None if none or not linear)."""
    for k, v in enumerate(ivars):
        try:
            d = sympy.diff(expr, v)
        except Exception:
            return None
        if d == 1:
            return k
    return None


def choose_tiling(group) -> Optional[tuple]:
    """(X, R) for a 2-D tiled pointwise kernel, or None to keep it 1-D."""
    if group.is_reduction() or not group.is_kernel():
        return None
    for n in group.nodes:
        if len(n.ranges) < 2 or n.has_indirect:
            continue
        # a view of a view (BERT's keys: reshaped, permuted, flattened to [heads, dim, seq]) leaves floors
        # and mods of flattened indices that the loop ranges reduce to plain variables
        ranges = tuple(zip(n.ivars, n.ranges))
        dims = {_contiguous_dim(simplify_index(d.index, ranges), n.ivars) for d in n.read_deps + n.write_deps}
        dims.discard(None)
        if not dims:
            continue
        if len(dims) == 1:
            # every access is contiguous along one dim that is not the last (channels-last buffers walked
            # in NCHW order): a flat index would step by the channel count; tiles put that dim on the x
            # axis, where consecutive programs' lanes read consecutive elements
            split = dims.pop() + 1
            if split == len(n.ranges):
                continue
        else:
            split = max(dims)             # inner axis: from the later contiguous dim to the end
        if split == 0:
            continue
        X, R = product(n.ranges[:split]), product(n.ranges[split:])
        if hint(X) < 16 or hint(R) < 16:
            return None
        if all(m.split((X, R)) is not None for m in group.nodes):
            return (X, R)
    return None
