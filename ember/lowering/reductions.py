"""Reductions: sum, mean, prod, amax/amin, max/min.dim, any/all, argmax/argmin, var/std (Welford),
softmax's row statistics (an online max and sum of exp).

A reduction is realized as soon as it is built (its consumers load the stored row results); the
scheduler then fuses it with its pointwise producers and consumers into one kernel.
"""
from __future__ import annotations

import sympy
import torch

from ..device import backend_for
from ..graph.custom_ops import softmax_stats
from ..ir.nodes import Reduction, TensorBox
from ..ir.ops import ops
from ..ir.symbolic import FloorDiv, ModularIndexing, contiguous_strides, product, sympify
from .pointwise import cast, pointwise, to_dtype
from .registry import Unsupported, lower
from .views import unsqueeze

aten = torch.ops.aten
prims = torch.ops.prims


def _dims(x, dims):
    n = x.dim()
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({(d + n if d < 0 else d) if n else 0 for d in dims})


def _reduced_and_kept(x, dims):
    """(reduced dims, kept dims) of reducing x over dims, each sorted."""
    dims = _dims(x, dims) if x.dim() else []
    return dims, [i for i in range(x.dim()) if i not in dims]


def reduce(x: TensorBox, dims, reduction_type: str, dtype: torch.dtype, src_dtype=None,
           keepdim=False, output_index=None) -> TensorBox:
    """Reduce x over dims. The values are cast to src_dtype before reducing; dtype is the result's."""
    dims, kept = _reduced_and_kept(x, dims)
    size = x.get_size()
    ranges = [size[i] for i in kept]
    rranges = [size[i] for i in dims]
    loader, xdtype = x.make_loader(), x.dtype
    src_dtype = src_dtype or xdtype
    if product(rranges) == 1:
        box = _one_element(x, kept, dims, reduction_type, dtype, src_dtype, output_index, ranges)
        return _unsqueeze_all(box, dims) if keepdim else box
    split = _split_count(ranges, rranges, reduction_type, x.device, strided=x.dim() - 1 in kept)
    if split > 1 and reduction_type in _ARG:
        return _split_arg(x, kept, dims, split, reduction_type, src_dtype, keepdim)
    if split > 1:
        return _split_reduce(x, kept, dims, split, reduction_type, dtype, src_dtype, keepdim)

    def inner_fn(idx, ridx):
        full = [None] * len(size)
        for pos, i in enumerate(kept):
            full[i] = idx[pos]
        for pos, i in enumerate(dims):
            full[i] = ridx[pos]
        return cast(loader(full), xdtype, src_dtype)

    box = TensorBox(Reduction(x.device, dtype, inner_fn, ranges, rranges, reduction_type, src_dtype, output_index))
    box.realize()
    if keepdim:
        for d in dims:
            box = unsqueeze(box, d)
    return box


def _one_element(x, kept, dims, reduction_type, dtype, src_dtype, output_index, ranges):
    """A reduction over a single element (size-1 dims, a 0-dim tensor) is a pointwise function of it."""
    size, loader, xdtype = x.get_size(), x.make_loader(), x.dtype

    def inner_fn(idx):
        full = [sympy.Integer(0)] * len(size)
        for pos, i in enumerate(kept):
            full[i] = idx[pos]
        v = cast(loader(full), xdtype, src_dtype)
        if reduction_type in ("argmax", "argmin"):
            return ops.constant(0, dtype)
        if reduction_type == "welford" and output_index == 1:     # m2: 0, or nan for a nan/inf element
            d = ops.sub(v, v)
            return cast(ops.mul(d, d), src_dtype, dtype)
        if reduction_type == "welford" and output_index == 2:     # weight
            return ops.constant(1, dtype)
        if reduction_type == "online_softmax" and output_index == 1:     # exp(v - max): 1, nan for inf/nan
            return cast(ops.exp(ops.sub(v, v)), src_dtype, dtype)
        return cast(v, src_dtype, dtype)

    return TensorBox.pointwise(x.device, dtype, inner_fn, ranges)


# Few long rows leave most of a GPU idle: one program per row, or per XBLOCK rows when the rows are
# reduced along a strided dim (the columns of a row-major matrix, a LayerNorm weight's gradient over the
# batch). Such a reduction runs in two kernels: the first reduces chunks of each row into partial rows,
# the second reduces the partials. How few rows and how many partials is the kernel backend's call
# (KernelBackend.reduction_split_rows). ConvNeXt's LayerNorm weight gradients, 96 rows of 50176 read along
# columns, are 3 programs unsplit (docs/performance.md, "Reductions are split only where the backend gains").
_SPLITTABLE = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin")
# argmax / argmin -> the value reduction whose partials choose the chunk (_split_arg)
_ARG = {"argmax": "max", "argmin": "min"}
# elements of a row one partial reduces, at least. Not less: at 128 a LayerNorm over 4096 rows of 768 (GPT-2's,
# BERT's) would split into three kernels (GPT-2 inference: 104 kernels instead of 41)
SPLIT_MIN_CHUNK = 512
# ... where the rows are reduced along a strided dim (the last dim is kept): a bias gradient's column sum over
# 2048 tokens and 768 columns runs about twice as fast in chunks of 256 as in chunks of 512
# (docs/performance.md; `python -m experiments.column_sum_probe`)
SPLIT_MIN_CHUNK_STRIDED = 128
SPLIT_MIN_ELEMENTS = 1 << 18
# ... for argmax / argmin, whose rows are a greedy decoder's logits: one row of 32000 took one program 8.7 us
# on an H100 (experiments/decode_step_probe.py)
SPLIT_MIN_ARG_ELEMENTS = 1 << 14


def _split_count(ranges, rranges, reduction_type, device: torch.device, strided=False) -> int:
    """Partials per row: 1 (no split) or a power of two that divides the row into chunks of at least
    SPLIT_MIN_CHUNK elements (SPLIT_MIN_CHUNK_STRIDED for rows reduced along a strided dim)."""
    min_chunk = SPLIT_MIN_CHUNK_STRIDED if strided else SPLIT_MIN_CHUNK
    if reduction_type not in _SPLITTABLE or not rranges:
        return 1
    X, R = product(ranges), product(rranges)
    if not (X.is_Integer and R.is_Integer):
        return 1
    X, R = int(X), int(R)
    most, aim = backend_for(device).reduction_split_rows(strided)
    min_elements = SPLIT_MIN_ARG_ELEMENTS if reduction_type in _ARG else SPLIT_MIN_ELEMENTS
    if X > most or X * R < min_elements or R < 2 * min_chunk:
        return 1
    split = 1
    while X * split * 2 <= aim and R % (split * 2) == 0 and R // (split * 2) >= min_chunk:
        split *= 2      # chunks divide the row exactly, so no chunk reads past its end
    return split


def _split_partials(x, kept, dims, split, reduction_type, dtype, src_dtype, output_index=None):
    """The first step of a split reduction, realized: partials laid out (split, *kept), so the first
    kernel's consecutive rows are consecutive kept positions and a reduction along a strided dim still
    reads along the contiguous one."""
    size = x.get_size()
    rsizes = [size[i] for i in dims]
    chunk = product(rsizes) / split
    loader, xdtype = x.make_loader(), x.dtype
    strides = contiguous_strides(rsizes)

    def inner_fn(idx, ridx):
        flat = idx[0] * chunk + ridx[0]
        full = [None] * len(size)
        for pos, i in enumerate(kept):
            full[i] = idx[pos + 1]
        for k, i in enumerate(dims):
            full[i] = FloorDiv(flat, strides[k]) if k == 0 else ModularIndexing(flat, strides[k], rsizes[k])
        return cast(loader(full), xdtype, src_dtype)

    ranges = [sympy.Integer(split)] + [size[i] for i in kept]
    partial = TensorBox(Reduction(x.device, dtype, inner_fn, ranges, [chunk], reduction_type, src_dtype,
                                  output_index))
    partial.realize()
    return partial


def _split_reduce(x, kept, dims, split, reduction_type, dtype, src_dtype, keepdim):
    partial = _split_partials(x, kept, dims, split, reduction_type, dtype, src_dtype)
    out = reduce(partial, [0], reduction_type, dtype, src_dtype=dtype, keepdim=False)
    return _unsqueeze_all(out, dims) if keepdim else out


def _split_arg(x, kept, dims, split, reduction_type, src_dtype, keepdim):
    """argmax / argmin of `split` equal chunks of each row: each chunk's extreme value and its index in the
    chunk (one kernel), then the chunk whose value wins (the first of equals, as the chunks are in order) and
    its index plus the chunk's start. The first occurrence of the extreme (NaN counting as it, as in eager)
    stays the answer: the winning chunk is the first holding it, and within it the index is the first."""
    values = _split_partials(x, kept, dims, split, _ARG[reduction_type], src_dtype, src_dtype)
    local = _split_partials(x, kept, dims, split, reduction_type, torch.int64, src_dtype)
    winner = reduce(values, [0], reduction_type, torch.int64, src_dtype=src_dtype)
    chunk = product(x.get_size()[i] for i in dims) / split
    local_loader, winner_loader = local.make_loader(), winner.make_loader()

    def inner_fn(idx):
        w = winner_loader(idx)
        at = local_loader([ops.indirect_indexing(w, sympy.Integer(split)), *idx])
        return ops.add(ops.mul(w, ops.constant(int(chunk), torch.int64)), at)
    out = TensorBox.pointwise(x.device, torch.int64, inner_fn, winner.get_size())
    return _unsqueeze_all(out, dims) if keepdim else out


def _split_welford(x, kept, dims, split, acc, keepdim):
    """(mean, m2, count) from the Welford statistics of `split` equal chunks of each row, combined as
    Chan et al. do for equal weights: mean = mean of the chunk means, m2 = sum of the chunk m2s plus
    chunk * sum of (chunk mean - mean)^2. A BatchNorm's statistics over N*H*W for few channels are the
    reduction this is for."""
    size = x.get_size()
    count = product(size[i] for i in dims)
    chunk = float(count / split)
    mean_c = _split_partials(x, kept, dims, split, "welford", acc, acc, output_index=0)
    m2_c = _split_partials(x, kept, dims, split, "welford", acc, acc, output_index=1)
    total = reduce(mean_c, [0], "sum", acc, src_dtype=acc)
    mean_ = pointwise(lambda t: ops.truediv(t, ops.constant(float(split), acc)), total, compute_dtype=acc)

    def spread(m2, mc, m):
        d = ops.sub(mc, m)
        return ops.add(m2, ops.mul(ops.constant(chunk, acc), ops.mul(d, d)))
    m2 = reduce(pointwise(spread, m2_c, mean_c, unsqueeze(mean_, 0), compute_dtype=acc), [0], "sum", acc,
                src_dtype=acc)
    weight = pointwise(lambda t: ops.constant(float(count), acc), mean_, compute_dtype=acc)
    outs = [mean_, m2, weight]
    return [_unsqueeze_all(o, dims) for o in outs] if keepdim else outs


def _unsqueeze_all(box, dims):
    for d in dims:
        box = unsqueeze(box, d)
    return box


def _acc_dtype(dtype):
    if dtype.is_floating_point:
        return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return torch.int64


@lower(aten.sum.dim_IntList, aten.sum.default)
def sum_(x, dims=None, keepdim=False, *, dtype=None):
    out = dtype or (x.dtype if x.dtype.is_floating_point else torch.int64)
    # a uint8 sum wraps modulo 256 however wide its accumulator: accumulated as uint8 it is one buffer, not
    # an int64 reduction and a cast that a second reader would read the int64 bytes through (the packed
    # dropout masks' bits)
    acc = out if out == torch.uint8 else _acc_dtype(out)
    r = reduce(x, dims, "sum", acc, src_dtype=acc, keepdim=keepdim)
    return r if acc == out else to_dtype(r, out)


@lower(prims.sum.default)
def prims_sum(x, dims, *, output_dtype=None):
    return sum_(x, dims, dtype=output_dtype)


@lower(aten.mean.dim, aten.mean.default)
def mean(x, dims=None, keepdim=False, *, dtype=None):
    out = dtype or x.dtype
    if not out.is_floating_point:
        raise Unsupported("mean of integers")
    n = product(x.get_size()[d] for d in _dims(x, dims)) if x.dim() else sympy.Integer(1)
    acc = _acc_dtype(out)
    s = reduce(x, dims, "sum", acc, src_dtype=acc, keepdim=keepdim)
    return pointwise(lambda v, c: ops.truediv(v, c), s, n, out_dtype=out, compute_dtype=acc)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    out = dtype or (x.dtype if x.dtype.is_floating_point else torch.int64)
    acc = _acc_dtype(out)
    r = reduce(x, dim, "prod", acc, src_dtype=acc, keepdim=keepdim)
    return r if acc == out else to_dtype(r, out)


def _minmax(kind):
    def lowering(x, dims=(), keepdim=False):
        if x.dtype == torch.bool:
            return reduce(x, dims, "any" if kind == "max" else "all", torch.bool, keepdim=keepdim)
        acc = _acc_dtype(x.dtype) if x.dtype.is_floating_point else x.dtype
        r = reduce(x, dims, kind, acc, src_dtype=acc, keepdim=keepdim)
        return r if acc == x.dtype else to_dtype(r, x.dtype)
    return lowering


lower(aten.amax.default)(_minmax("max"))
lower(aten.amin.default)(_minmax("min"))


def _max_dim(kind):
    def lowering(x, dim, keepdim=False):
        values = _minmax(kind)(x, [dim], keepdim)
        indices = arg(kind)(x, dim, keepdim)
        return values, indices
    return lowering


lower(aten.max.dim)(_max_dim("max"))
lower(aten.min.dim)(_max_dim("min"))


@lower(aten.max.default)
def max_all(x):
    return _minmax("max")(x)


@lower(aten.min.default)
def min_all(x):
    return _minmax("min")(x)


def arg(kind):
    def lowering(x, dim=None, keepdim=False):
        acc = _acc_dtype(x.dtype) if x.dtype.is_floating_point else x.dtype
        if x.dtype == torch.bool:
            acc = torch.int32
        if dim is None:
            r = reduce(x, None, "arg" + kind, torch.int64, src_dtype=acc)
            if keepdim:
                for d in range(x.dim()):
                    r = unsqueeze(r, d)
            return r
        return reduce(x, [dim], "arg" + kind, torch.int64, src_dtype=acc, keepdim=keepdim)
    return lowering


lower(aten.argmax.default)(arg("max"))
lower(aten.argmin.default)(arg("min"))


def _truth(x, dim, keepdim, reduction_type: str):
    """any / all of x != 0: bool, but uint8 for a uint8 x (as eager keeps that dtype)."""
    b = x if x.dtype == torch.bool else \
        pointwise(lambda v: ops.ne(v, ops.constant(0, x.dtype)), x, out_dtype=torch.bool)
    out = reduce(b, dim, reduction_type, torch.bool, keepdim=keepdim)
    return to_dtype(out, torch.uint8) if x.dtype == torch.uint8 else out


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return _truth(x, dim, keepdim, "any")


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return _truth(x, dim, keepdim, "all")


def welford(x, dims, keepdim):
    """(mean, m2, count) of x over dims, in float32 for narrow floats."""
    acc = _acc_dtype(x.dtype)
    rdims, kept = _reduced_and_kept(x, dims)
    size = x.get_size()
    split = _split_count([size[i] for i in kept], [size[i] for i in rdims], "sum", x.device)
    if split > 1:
        return _split_welford(x, kept, rdims, split, acc, keepdim)
    outs = [reduce(x, dims, "welford", acc, src_dtype=acc, keepdim=keepdim, output_index=i) for i in range(3)]
    return outs


@lower(softmax_stats)
def softmax_stats_(x, dim):
    """(max, sum of exp(x - max)) over dim, kept: one reduction (an online one where rows are looped)."""
    if x.dtype not in (torch.float32, torch.float64):
        raise Unsupported("softmax_stats of a narrow or integer dtype")
    return tuple(reduce(x, [dim], "online_softmax", x.dtype, keepdim=True, output_index=i) for i in range(2))


def _var_from(m2, n, correction):
    """m2 / max(n - correction, 0), in m2's dtype (a float correction stays a float)."""
    def fn(v, count, c):
        return ops.truediv(v, ops.maximum(ops.sub(count, c), ops.constant(0.0, m2.dtype)))
    return pointwise(fn, m2, sympify(n), float(correction), compute_dtype=m2.dtype)


def _count(x, dims):
    return product(x.get_size()[d] for d in _dims(x, dims)) if x.dim() else sympy.Integer(1)


def _var_std(x, dims, correction, keepdim, sqrt):
    """(var or std, mean) in the accumulation dtype, each rounded once to x's dtype."""
    if not x.dtype.is_floating_point:
        raise Unsupported("var/std of integers")
    correction = 1 if correction is None else correction
    mean_, m2, _ = welford(x, dims, keepdim)
    count = _count(x, dims)
    if count == 0:     # the mean of nothing is nan (0 / 0), as in eager
        mean_ = pointwise(lambda v: ops.constant(float("nan"), mean_.dtype), mean_)
    v = _var_from(m2, count, correction)
    if sqrt:
        v = pointwise(ops.sqrt, v)
    return to_dtype(v, x.dtype), to_dtype(mean_, x.dtype)


@lower(aten.var.correction)
def var(x, dims=None, *, correction=None, keepdim=False):
    return _var_std(x, dims, correction, keepdim, sqrt=False)[0]


@lower(aten.var_mean.correction)
def var_mean(x, dims=None, *, correction=None, keepdim=False):
    return _var_std(x, dims, correction, keepdim, sqrt=False)


@lower(aten.std.correction)
def std(x, dims=None, *, correction=None, keepdim=False):
    return _var_std(x, dims, correction, keepdim, sqrt=True)[0]


@lower(aten.std_mean.correction)
def std_mean(x, dims=None, *, correction=None, keepdim=False):
    return _var_std(x, dims, correction, keepdim, sqrt=True)
