"""Tiling: a pointwise kernel whose accesses are contiguous along different dimensions (a transpose), or
all along one dim that is not its last (channels-last buffers in NCHW order), iterates over 2-D tiles, so
that both its loads and its stores walk memory contiguously.

The tile splits each node's dims at one point: outer dims are the kernel's x axis, inner dims its
second axis (the same split a reduction kernel uses for rows and row elements). What differs between
kernel backends is a `TilingPolicy`."""
from __future__ import annotations

import dataclasses
from typing import Optional

import sympy

from ..ir.symbolic import hint, product, simplify_index, terms_with


@dataclasses.dataclass(frozen=True)
class TilingPolicy:
    # both tile axes at least this long, else the kernel stays 1-D
    min_extent: int
    # tile a kernel whose accesses are all contiguous along one dim that is not the last (channels-last
    # buffers walked in NCHW order)
    one_contiguous_dim: bool
    # tile only where every node has dims on the inner axis (a node without them would be computed
    # again for each element of its tile row)
    every_node_inner: bool


# The Triton backend's policy (choose_tiling's default): a program's block takes the tile, so a single
# non-last contiguous dim put on the x axis makes consecutive programs' lanes read consecutive elements.
DEFAULT_TILING = TilingPolicy(min_extent=16, one_contiguous_dim=True, every_node_inner=False)


def _contiguous_dim(expr, ivars) -> Optional[int]:
    """The loop dim along which expr moves by 1 (None if none or not linear): the one variable that is a
    term of the expanded sum and appears in no other term (inside a floor or modulus it does not move
    expr by 1 everywhere)."""
    for k, v in enumerate(ivars):
        if terms_with(expr, v) == [v]:
            return k
    return None


def choose_tiling(group, policy: TilingPolicy = DEFAULT_TILING) -> Optional[tuple]:
    """(X, R) for a 2-D tiled pointwise kernel, or None to keep it 1-D."""
    if group.is_reduction() or not group.is_kernel():
        return None
    for n in group.nodes:
        if len(n.ranges) < 2 or n.has_indirect:
            continue
        # indices simplified with the node's loop bounds: a view of a view (BERT's keys: reshaped, permuted,
        # flattened to [heads, dim, seq]) leaves floors and mods of flattened indices that mean plain variables
        ranges = tuple(zip(n.ivars, n.ranges))
        dims = {_contiguous_dim(simplify_index(sympy.sympify(d.index), ranges), n.ivars)
                for d in n.read_deps + n.write_deps}
        dims.discard(None)
        if not dims:
            continue
        if len(dims) == 1:
            # every access is contiguous along one dim: tiles help only where it is not the last
            if not policy.one_contiguous_dim:
                continue
            split = dims.pop() + 1
            if split == len(n.ranges):
                continue
        else:
            split = max(dims)             # inner axis: from the later contiguous dim to the end
        if split == 0:
            continue
        X, R = product(n.ranges[:split]), product(n.ranges[split:])
        if hint(X) < policy.min_extent or hint(R) < policy.min_extent:
            return None
        splits = [m.split((X, R)) for m in group.nodes]
        if all(s is not None and (s[1] or not policy.every_node_inner) for s in splits):
            return (X, R)
    return None
