"""Ops ember adds to ATen graphs (namespace `ember`, through torch.library): what a post-grad pass rewrites
a pattern into where ember has one kernel for what ATen spells as several ops. Each has an eager
implementation, so a fake-tensor run and an ATen fallback work as for any op, and an ember lowering.

    ember::softmax_stats(x, dim) -> (amax(x, dim, keepdim=True), sum(exp(x - amax), dim, keepdim=True))
        softmax's and log-softmax's row statistics as one reduction that reads each row once (an online
        max and rescaled sum, where a long row is reduced in chunks); lowered in lowering/reductions.py.
    ember::integer_resize(x, size, scale_factor, mode, align_corners, antialias) -> Tensor
        F.interpolate of an integer image by eager's own kernel, left opaque to AOTAutograd, whose trace
        would otherwise replace it by a float decomposition (graph/passes/integer_resize.py).
"""
from __future__ import annotations

import torch

_lib = torch.library.Library("ember", "DEF")
_lib.define("softmax_stats(Tensor x, int dim) -> (Tensor, Tensor)")


def _softmax_stats(x: torch.Tensor, dim: int):
    m = torch.amax(x, dim, keepdim=True)
    return m, torch.exp(x - m).sum(dim, keepdim=True)


_lib.impl("softmax_stats", _softmax_stats, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::softmax_stats")
def _softmax_stats_fake(x: torch.Tensor, dim: int):
    shape = list(x.shape)
    shape[dim] = 1
    return x.new_empty(shape), x.new_empty(shape)


softmax_stats = torch.ops.ember.softmax_stats.default


_lib.define("padded_mm(Tensor a, Tensor b, Tensor? bias, int m, int n) -> Tensor")
# The rows of one product chunk: enough to keep the GEMM efficient, few enough that the chunk is a small
# part of a logits-sized result (GPT-2's 4096 x 50264 bf16 product is 412 MB; a chunk is 1/8 of it)
PADDED_MM_CHUNK_BYTES = 64 << 20
PADDED_MM_MIN_ROWS = 256


def padded_mm_rows(m: int, padded_cols: int, itemsize: int) -> int:
    rows = PADDED_MM_CHUNK_BYTES // max(1, padded_cols * itemsize)
    return min(m, max(PADDED_MM_MIN_ROWS, rows // 64 * 64))


def _padded_mm(a: torch.Tensor, b: torch.Tensor, bias, m: int, n: int):
    from ..runtime.row_copy import copy_rows
    out = a.new_empty((m, n))
    rows = padded_mm_rows(m, b.shape[1], a.element_size())
    chunk = a.new_empty((rows, b.shape[1]))
    for r in range(0, m, rows):
        c = min(rows, m - r)
        if bias is None:
            torch.mm(a[r:r + c], b, out=chunk[:c])
        else:
            torch.addmm(bias, a[r:r + c], b, out=chunk[:c])
        copy_rows(out[r:r + c], chunk[:c, :n])
    return out


_lib.impl("padded_mm", _padded_mm, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::padded_mm")
def _padded_mm_fake(a, b, bias, m, n):
    return a.new_empty((m, n))


padded_mm = torch.ops.ember.padded_mm.default


_lib.define("integer_resize(Tensor x, int[]? size, float[]? scale_factor, str mode, bool? align_corners, "
            "bool antialias) -> Tensor")


def _integer_resize(x, size, scale_factor, mode: str, align_corners, antialias: bool):
    return torch.nn.functional.interpolate(x, size=size, scale_factor=scale_factor, mode=mode,
                                           align_corners=align_corners, antialias=antialias)


_lib.impl("integer_resize", _integer_resize, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::integer_resize")
def _integer_resize_fake(x, size, scale_factor, mode, align_corners, antialias):
    # the float decomposition that a fake tensor runs has eager's output size and memory format
    return _integer_resize(x, size, scale_factor, mode, align_corners, antialias)


integer_resize = torch.ops.ember.integer_resize.default
