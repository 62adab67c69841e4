"""What a node's fake tensor (its `meta["val"]`) says about the layout eager gives the value: lowerings
store a value with eager's strides where a reader (a graph output, an ATen kernel, a backward graph) was
compiled for them."""
from __future__ import annotations

import torch

from ..ir.symbolic import sympify

# renamed in torch 2.13 (it answers False where a symbolic size leaves it undecided)
_non_overlapping_and_dense = getattr(torch._prims_common, "is_non_overlapping_and_dense_or_false", None) or \
    getattr(torch._prims_common, "is_non_overlapping_and_dense")


def is_dense(t: torch.Tensor) -> bool:
    """Does t cover its storage from offset 0 without gaps or overlaps (any dim order)?"""
    try:
        return bool(_non_overlapping_and_dense(t)) and t.storage_offset() == 0
    except Exception:
        return False


def has_static_layout(t: torch.Tensor) -> bool:
    """Are t's sizes, strides and offset plain ints (no symbols; asking about a symbol adds a guard)?"""
    return all(type(v) is int for v in (*t.shape, *t.stride(), t.storage_offset()))


def is_non_overlapping(t: torch.Tensor) -> bool:
    """Static strides, offset 0, and no two elements at one address (gaps allowed)."""
    if not has_static_layout(t) or t.storage_offset() != 0:
        return False          # symbolic: asking would add a guard
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    reach = 1
    for st, n in dims:
        if st < reach:
            return False
        reach = st * n
    return True


def same_shape(meta, box) -> bool:
    """Is `meta` a fake tensor of `box`'s shape?"""
    return isinstance(meta, torch.Tensor) and meta.dim() == box.dim() and \
        [sympify(s) for s in meta.shape] == list(box.get_size())
