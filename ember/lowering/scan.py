"""Scans: cumsum, cumprod, logcumsumexp as ember kernels (ir.nodes.Scan).

A scan is realized as soon as it is built and runs as a kernel of its own: its rows are the other dims,
the scanned dim is the kernel's r axis, and pointwise producers are inlined into the values it scans.
The values are cast to the result's dtype first, as eager does (`dtype=`; integers and bools become
int64 for cumsum and cumprod), so the running value is kept in that dtype (float32 for float16 and
bfloat16, the kernels' compute type for them).
"""
from __future__ import annotations

import torch

from ..ir.nodes import Scan, TensorBox
from .pointwise import cast, to_dtype
from .registry import Unsupported, lower

aten = torch.ops.aten


def scan(x: TensorBox, dim: int, combine: str, dtype: torch.dtype) -> TensorBox:
    if dtype == torch.bool or dtype.is_complex:
        raise Unsupported(f"scan to {dtype}")
    size = list(x.get_size())
    if not size:
        return to_dtype(x, dtype)          # a 0-d tensor scans to itself
    d = dim + len(size) if dim < 0 else dim
    if size[d] == 1 or any(s == 0 for s in size):
        return to_dtype(x, dtype)          # one step (or nothing) to combine
    loader, src = x.make_loader(), x.dtype

    def inner_fn(idx, sidx):
        return cast(loader(list(idx[:d]) + [sidx[0]] + list(idx[d:])), src, dtype)

    box = TensorBox(Scan(x.device, dtype, inner_fn, size[:d] + size[d + 1:], size[d], d, combine))
    box.realize()
    return box


def _promoted(x, dtype):
    return dtype or (x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64)


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    return scan(x, dim, "add", _promoted(x, dtype))


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    return scan(x, dim, "mul", _promoted(x, dtype))


@lower(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    if not x.dtype.is_floating_point:
        raise Unsupported(f"logcumsumexp of {x.dtype}")
    return scan(x, dim, "logaddexp", x.dtype)
