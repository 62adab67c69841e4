"""Upsampling over the last two dims: nearest, nearest-exact and bilinear, and their backwards.

Each output element loads the input elements its source position maps to, with eager's index arithmetic
(ATen's UpSample.h): the scale is a float32 (1 / the given scale factor, else in / out) and the source
position is computed in float32. Where that arithmetic provably gives an integer formula (2x nearest is
o // 2), the load index is that formula, with no float math in the kernel.

Backwards gather: input element i sums the grads of the few outputs whose source positions touch it. With
static sizes the source position of every output is known when compiling, which bounds those outputs to a
short run [base(i), base(i) + K) with base(i) = i * out // in + c (or another slope that fits better); in
the kernel each candidate recomputes its source position with the forward's arithmetic and contributes
only where it really touches i.

With torch.compile these ops rarely reach ember: PyTorch's Python dispatcher decomposes them above
autograd while AOTAutograd traces (into aten.index / index_put). They do arrive in graphs handed to
ember.compile_graph, and in traces made without the Python dispatcher.
"""
from __future__ import annotations

import dataclasses
import fractions
import math
from typing import Optional

import sympy
import torch

from ..ir.nodes import TensorBox
from ..ir.ops import ops
from ..ir.symbolic import FloorDiv, sympify
from .pointwise import cast
from .pooling import (acc_dtype, accumulate, both, clamp_index, in_bounds, int_value, masked,
                      realize_if_costly, static)
from .registry import Unsupported, lower

aten = torch.ops.aten

_F32, _I64 = torch.float32, torch.int64
MAX_CANDIDATES = 8          # outputs per axis a backward visits for each input element
_EPS = 1e-5                 # relative slack for float32 rounding in the compile-time source positions


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=_F32))


def _div32(a, b) -> float:
    """a / b in float32, as the C++ `static_cast<float>(a) / b` eager computes its scales with."""
    return float(torch.tensor(float(a), dtype=_F32) / torch.tensor(float(b), dtype=_F32))


@dataclasses.dataclass
class _Map:
    """How output positions along one axis map to input positions: nearest (exact: the half-pixel
    variant) or linear (align_corners)."""
    size: sympy.Expr            # input extent
    out: sympy.Expr
    mode: str                   # "nearest" | "exact" | "linear"
    scale: Optional[float]      # eager's float32 scale, or None where it is in / out of symbolic sizes
    align_corners: bool = False

    def __post_init__(self):
        # eager copies when the sizes match (linear: whatever the scale; nearest: the scale is then 1)
        self.identity = self.out == self.size and (self.mode == "linear" or self.scale in (None, 1.0))
        self.formula = None if self.identity or self.mode == "linear" else _integer_formula(self)

    def _scale_value(self):
        if self.scale is not None:
            return ops.constant(self.scale, _F32)
        return ops.truediv(ops.index_expr(self.size, _F32), ops.index_expr(self.out, _F32))

    def source(self, o):
        """The float32 source position of output o (ops value), as eager computes it."""
        of = ops.index_expr(o, _F32)
        if self.mode == "nearest":
            return ops.mul(of, self._scale_value())
        half = ops.constant(0.5, _F32)
        if self.mode == "exact":
            return ops.mul(ops.add(of, half), self._scale_value())
        if self.align_corners:
            return ops.mul(self._scale_value(), of)
        src = ops.sub(ops.mul(self._scale_value(), ops.add(of, half)), half)
        return ops.maximum(src, ops.constant(0.0, _F32))

    def nearest(self, o):
        """Input position of output o for the nearest modes: a sympy expression when an integer
        formula is exact, else an ops int64 value."""
        if self.identity:
            return o
        if self.formula is not None:
            return self.formula(o)
        v = ops.to_dtype(ops.floor(self.source(o)), _I64, _F32)
        return ops.minimum(v, int_value(self.size - 1))

    def linear(self, o):
        """(i0, i1, lambda0, lambda1) of output o: eager's two neighbours and their weights."""
        src = self.source(o)
        i0 = ops.minimum(ops.to_dtype(ops.floor(src), _I64, _F32), int_value(self.size - 1))
        l1 = ops.sub(src, ops.to_dtype(i0, _F32, _I64))
        l1 = ops.minimum(ops.maximum(l1, ops.constant(0.0, _F32)), ops.constant(1.0, _F32))
        l0 = ops.sub(ops.constant(1.0, _F32), l1)
        step = ops.where(ops.lt(i0, int_value(self.size - 1)), ops.constant(1, _I64), ops.constant(0, _I64))
        return i0, ops.add(i0, step), l0, l1

    # compile-time copies of the arithmetic above, in float64 (each float32 result lies within _EPS)
    def touched(self, o: int) -> set:
        """Input positions output o may touch, allowing for float32 rounding at integer boundaries."""
        n, s = int(self.size), self.scale
        if self.identity:
            return {o}
        if self.formula is not None:       # the kernel uses this exact integer formula
            return {int(self.formula(sympy.Integer(o)))}
        if self.mode == "nearest":
            src = o * s
        elif self.mode == "exact":
            src = (o + 0.5) * s
        else:
            src = s * o if self.align_corners else max(s * (o + 0.5) - 0.5, 0.0)
        slack = _EPS * (1 + abs(src))
        lows = {min(math.floor(src - slack), n - 1), min(math.floor(src + slack), n - 1)}
        lows = {max(v, 0) for v in lows}
        if self.mode != "linear":
            return lows
        return lows | {min(v + 1, n - 1) for v in lows}


def _integer_formula(m: _Map):
    """An integer formula equal to eager's float32 nearest index for every output, or None. Checked
    by running eager's float32 arithmetic over all outputs (static sizes only)."""
    n, o = static(m.size), static(m.out)
    if n is None or o is None or m.scale is None or o > 1 << 20:
        return None
    pos = torch.arange(o, dtype=_F32)
    if m.mode == "exact":
        pos = pos + 0.5
    want = torch.clamp((pos * m.scale).floor().to(_I64), max=n - 1)
    ar = torch.arange(o, dtype=_I64)
    if m.mode == "exact":
        candidates = [(lambda i: FloorDiv((2 * i + 1) * n, 2 * o), ((2 * ar + 1) * n) // (2 * o))]
    else:
        candidates = [(lambda i: FloorDiv(i * n, o), (ar * n) // o)]
    for f, got in candidates:
        if torch.equal(got, want):
            return f
    return None


def _scale(n, o, given, mode, align_corners):
    """eager's float32 scale (area_pixel_compute_scale / compute_scales_value)."""
    if mode == "linear" and align_corners:
        n_, o_ = static(n), static(o)
        if n_ is None or o_ is None:
            raise Unsupported("align_corners with symbolic sizes")
        return _div32(n_ - 1, o_ - 1) if o_ > 1 else 0.0
    if given is not None and given > 0:
        return _f32(1.0 / given)
    n_, o_ = static(n), static(o)
    return None if n_ is None or o_ is None else _div32(n_, o_)


def _maps(in_sizes, out_sizes, scales, mode, align_corners=False):
    scales = list(scales) if scales else [None, None]
    return [_Map(sympify(n), sympify(o), mode, _scale(n, o, s, mode, align_corners), align_corners)
            for n, o, s in zip(in_sizes, out_sizes, scales)]


def _vec_size(x, output_size, scale_factors):
    if output_size is not None:
        return list(output_size), None
    if scale_factors is None:
        raise Unsupported("upsample with neither output_size nor scale_factors")
    sizes = [static(n) for n in x.get_size()[-2:]]
    if any(n is None for n in sizes):
        raise Unsupported("upsample by scale factors of a symbolic size")
    return [int(n * s) for n, s in zip(sizes, scale_factors)], list(scale_factors)


def _check_4d(x):
    if x.dim() != 4:
        raise Unsupported(f"2-D upsampling of a {x.dim()}-D tensor")


# --- forward ---------------------------------------------------------------------------------------------

def _index(v, size):
    return v if isinstance(v, sympy.Expr) else ops.indirect_indexing(v, size, check=False)


def upsample_nearest(x, output_size, scales, exact):
    _check_4d(x)
    mh, mw = _maps(x.get_size()[-2:], output_size, scales, "exact" if exact else "nearest")
    loader = x.make_loader()

    def inner_fn(idx):
        *batch, oh, ow = idx
        return loader([*batch, _index(mh.nearest(oh), mh.size), _index(mw.nearest(ow), mw.size)])
    return TensorBox.pointwise(x.device, x.dtype, inner_fn, list(x.get_size()[:-2]) + [mh.out, mw.out])


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return upsample_nearest(x, output_size, [scales_h, scales_w], exact=False)


@lower(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(x, output_size, scales_h=None, scales_w=None):
    return upsample_nearest(x, output_size, [scales_h, scales_w], exact=True)


@lower(aten.upsample_nearest2d.vec)
def upsample_nearest2d_vec(x, output_size, scale_factors):
    return upsample_nearest(x, *_vec_size(x, output_size, scale_factors), exact=False)


@lower(aten._upsample_nearest_exact2d.vec)
def upsample_nearest_exact2d_vec(x, output_size, scale_factors):
    return upsample_nearest(x, *_vec_size(x, output_size, scale_factors), exact=True)


def upsample_bilinear(x, output_size, align_corners, scales):
    _check_4d(x)
    if not x.dtype.is_floating_point:
        raise Unsupported("bilinear upsampling of integers")
    mh, mw = _maps(x.get_size()[-2:], output_size, scales, "linear", align_corners)
    x = realize_if_costly(x, (1 if mh.identity else 2) * (1 if mw.identity else 2))
    loader, dtype = x.make_loader(), x.dtype
    acc = acc_dtype(dtype)

    def axis(m, o):
        if m.identity:
            return [(o, None)]
        i0, i1, l0, l1 = m.linear(o)
        return [(_index(i0, m.size), l0), (_index(i1, m.size), l1)]

    def weighted(terms):
        """t0 * w0 + t1 * w1, eager's order."""
        total = None
        for t, w in terms:
            total = accumulate(total, t if w is None else ops.mul(t, w))
        return total

    def inner_fn(idx):
        *batch, oh, ow = idx
        hs, ws = axis(mh, oh), axis(mw, ow)
        rows = [(weighted([(loader([*batch, ih, iw]), w_w) for iw, w_w in ws]), w_h) for ih, w_h in hs]
        return cast(weighted(rows), acc, dtype)
    return TensorBox.pointwise(x.device, dtype, inner_fn, list(x.get_size()[:-2]) + [mh.out, mw.out])


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return upsample_bilinear(x, output_size, align_corners, [scales_h, scales_w])


@lower(aten.upsample_bilinear2d.vec)
def upsample_bilinear2d_vec(x, output_size, align_corners, scale_factors):
    size, scales = _vec_size(x, output_size, scale_factors)
    return upsample_bilinear(x, size, align_corners, scales)


# --- backward --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Inverse:
    """The outputs that may touch input i along one axis: base(i) + j for j < count, where
    base(i) = i * num // den + shift follows the map's slope (out / in, or its align_corners or
    scale-factor variant)."""
    num: int
    den: int
    shift: int
    count: int
    low: bool       # base(i) + j may be < 0
    high: bool      # ... or >= out

    def output(self, i, j):
        return FloorDiv(i * self.num, self.den) + self.shift + j


def _inverse(m: _Map) -> _Inverse:
    n, o = static(m.size), static(m.out)
    if n is None or o is None or m.scale is None:
        raise Unsupported("upsample backward with symbolic sizes")
    by_input = {}
    for out in range(o):
        for i in m.touched(out):
            by_input.setdefault(i, []).append(out)
    if not by_input:
        raise Unsupported("upsample backward with an empty output")
    slopes = {(o, n), (max(o - 1, 1), max(n - 1, 1))}
    if m.scale > 0:
        f = fractions.Fraction(1 / m.scale).limit_denominator(64)
        slopes.add((f.numerator, f.denominator))
    best = None
    for num, den in slopes:
        shift = min(min(outs) - i * num // den for i, outs in by_input.items())
        count = max(max(outs) - i * num // den - shift for i, outs in by_input.items()) + 1
        if best is None or count < best.count:
            high = any(i * num // den + shift + count - 1 >= o for i in range(n))
            best = _Inverse(num, den, shift, count, shift < 0, high)
    if best.count > MAX_CANDIDATES:
        raise Unsupported(f"upsample backward with {best.count} outputs per input element")
    return best


def _backward(grad, input_size, maps, weight):
    """grad_input[i] = the sum over candidate outputs o (ascending, as eager adds them) of grad[o], where
    weight(map, o, i) = (mask, factor) says whether o touches i (mask, or None) and with what weight
    (factor, or None)."""
    if len(input_size) != 4 or grad.dim() != 4:
        raise Unsupported("2-D upsampling backward of a tensor that is not 4-D")
    inv = [_inverse(m) for m in maps]
    grad = realize_if_costly(grad, inv[0].count * inv[1].count)
    gl, dtype = grad.make_loader(), grad.dtype
    acc = acc_dtype(dtype)

    def candidates(a: _Inverse, m: _Map, i):
        out = []
        for j in range(a.count):
            o = a.output(i, j)
            out.append((clamp_index(o, m.out, a.low, a.high), in_bounds(o, m.out, a.low, a.high), weight(m, o, i)))
        return out

    def inner_fn(idx):
        *batch, ih, iw = idx
        total = None
        hs, ws = candidates(inv[0], maps[0], ih), candidates(inv[1], maps[1], iw)
        for lh, okh, (mh, fh) in hs:
            for lw, okw, (mw, fw) in ws:
                g = gl([*batch, lh, lw])
                if fh is not None:
                    g = ops.mul(ops.mul(fh, fw), g)
                total = accumulate(total, masked(g, both(both(okh, okw), both(mh, mw)), acc))
        return cast(total, acc, dtype)
    return TensorBox.pointwise(grad.device, dtype, inner_fn, [sympify(s) for s in input_size])


def _nearest_weight(m: _Map, o, i):
    src = m.nearest(o)
    if isinstance(src, sympy.Expr) and src == i:    # an integer formula can make every candidate a hit
        return None, None
    return ops.eq(int_value(src) if isinstance(src, sympy.Expr) else src, ops.index_expr(i, _I64)), None


def _linear_weight(m: _Map, o, i):
    here, zero, one = ops.index_expr(i, _I64), ops.constant(0.0, _F32), ops.constant(1.0, _F32)
    if m.identity:
        return None, ops.where(ops.eq(int_value(o), here), one, zero)
    i0, i1, l0, l1 = m.linear(o)
    return None, ops.add(ops.where(ops.eq(i0, here), l0, zero), ops.where(ops.eq(i1, here), l1, zero))


def _nearest_backward(grad, output_size, input_size, scales, exact):
    maps = _maps(list(input_size)[-2:], output_size, scales, "exact" if exact else "nearest")
    return _backward(grad, input_size, maps, _nearest_weight)


@lower(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad, output_size, input_size, scales_h=None, scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_h, scales_w], exact=False)


@lower(aten._upsample_nearest_exact2d_backward.default)
def upsample_nearest_exact2d_backward(grad, output_size, input_size, scales_h=None, scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_h, scales_w], exact=True)


@lower(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    if not grad.dtype.is_floating_point:
        raise Unsupported("bilinear upsampling backward of integers")
    maps = _maps(list(input_size)[-2:], output_size, [scales_h, scales_w], "linear", align_corners)
    return _backward(grad, input_size, maps, _linear_weight)
