"""2-D pooling: max_pool2d (with indices), avg_pool2d, adaptive avg pool, and their backwards.

A window is a few elements, so its loop is unrolled inside one Pointwise: each output element loads its
taps. A tap that may fall in the padding (or past a variable window's end) is loaded at a clamped index,
since every load must stay in bounds, and its value is masked. Backwards gather instead of scattering:
each input element visits the few output windows that can contain it, so no atomics are needed, and it
adds their contributions in eager's order (output positions ascending).

The last two dims are the spatial ones; leading dims (N, C or just C) pass through, so NCHW, CHW and
channels-last inputs share one code path (loads index logically; the layout is the buffer's business).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import sympy
import torch

from .. import config, state
from ..ir.deps import record_loops
from ..ir.nodes import Pointwise, Reduction, TensorBox
from ..ir.ops import ops
from ..ir.symbolic import FloorDiv, sympify
from .fallback import realize_arg
from .pointwise import cast
from .registry import Unsupported, lower

aten = torch.ops.aten

# Taps unrolled per output element (or candidate windows per input element in a backward). Beyond it a
# max pool goes to ATen and an adaptive average becomes a Reduction over the window.
MAX_WINDOW = 25

_I64 = torch.int64


# --- index helpers (upsample.py uses them too) -----------------------------------------------------------

def int_value(e):
    e = sympify(e)
    return ops.constant(int(e), _I64) if e.is_Integer else ops.index_expr(e, _I64)


def clamp_index(expr, size, low: bool, high: bool):
    """An index for a load at `expr`, clamped into [0, size) on the sides it may cross."""
    if not (low or high):
        return expr
    v = ops.index_expr(expr, _I64)
    if low:
        v = ops.maximum(v, ops.constant(0, _I64))
    if high:
        v = ops.minimum(v, int_value(sympify(size) - 1))
    return ops.indirect_indexing(v, size, check=False)


def in_bounds(expr, size, low: bool, high: bool):
    """ops bool: 0 <= expr (if low) and expr < size (if high); None when neither needs checking."""
    if not (low or high):
        return None
    v = ops.index_expr(expr, _I64)
    conds = ([ops.ge(v, ops.constant(0, _I64))] if low else []) + ([ops.lt(v, int_value(size))] if high else [])
    return conds[0] if len(conds) == 1 else ops.logical_and(*conds)


def both(a, b):
    return b if a is None else a if b is None else ops.logical_and(a, b)


def masked(v, ok, dtype):
    return v if ok is None else ops.where(ok, v, ops.constant(0, dtype))


def accumulate(total, v):
    return v if total is None else ops.add(total, v)


def acc_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def realize_if_costly(x: TensorBox, reads: int) -> TensorBox:
    """Store x first when recomputing it for each of `reads` loads costs more than storing it once. x is the
    lowered op's first argument; it is stored in the layout the graph gives that value (a channels-last
    plan's NHWC between a convolution and a pooling: graph/passes/conv_layout.py), not row-major."""
    if isinstance(x.data, Pointwise) and reads > 1:
        if record_loops(x.data.inner_fn, x.data.ranges).op_count * reads > config.realize_max_ops:
            node = state.current_graph().current_node
            arg = node.args[0] if node is not None and node.args else None
            meta = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if isinstance(meta, torch.Tensor):
                realize_arg(x, meta)
            else:
                x.realize()
    return x


def static(e) -> Optional[int]:
    e = sympify(e)
    return int(e) if e.is_Integer else None


# --- windows ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Axis:
    """One spatial axis of a window: output o covers inputs start(o) + j*step for j < taps, and (for
    variable windows) only those below end(o). low[j] / high[j]: tap j may fall below 0 / at or past
    `size` for some o, so its load is clamped and (for a fixed window) its value masked."""
    size: sympy.Expr
    out: sympy.Expr
    taps: int
    start: Callable
    step: int
    low: list
    high: list
    end: Optional[Callable] = None

    def pos(self, o, j):
        return self.start(o) + j * self.step

    def _sides(self, j):
        """(low, high) of tap j; of any tap for a symbolic j (a reduction over the window)."""
        return (self.low[j], self.high[j]) if isinstance(j, int) else (any(self.low), any(self.high))

    def index(self, o, j):
        return clamp_index(self.pos(o, j), self.size, *self._sides(j))

    def valid(self, o, j):
        if self.end is not None:     # end(o) <= size: the window check covers the bounds
            return ops.lt(ops.index_expr(self.pos(o, j), _I64), int_value(self.end(o)))
        return in_bounds(self.pos(o, j), self.size, *self._sides(j))

    def length(self, o):
        """The window's length at o: a sympy int, or an ops int64 value for variable windows."""
        return sympy.Integer(self.taps) if self.end is None else ops.sub(int_value(self.end(o)),
                                                                           int_value(self.start(o)))


def _pair(v, name):
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(a, int) for a in v):
        raise Unsupported(f"pooling {name} {v}")
    return v


def _pool_out_size(n, k, s, p, d, ceil_mode):
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:    # the last window must start inside the input or left pad
        out -= 1
    return out


def sliding_axes(x, kernel_size, stride, padding, dilation, ceil_mode, outs=None):
    """The two axes of a kernel_size window moved by stride over x padded by padding. `outs`: the
    output sizes, where a backward knows them (from grad); else computed, or read from the node's
    fake tensor when sizes are symbolic."""
    if x.dim() not in (3, 4):
        raise Unsupported(f"2-D pooling of a {x.dim()}-D tensor")
    k = _pair(kernel_size, "kernel_size")
    s = _pair(stride, "stride") if stride else k
    p, d = _pair(padding, "padding"), _pair(dilation, "dilation")
    if k[0] * k[1] > MAX_WINDOW:
        raise Unsupported(f"pooling window of {k[0]}x{k[1]} elements")
    sizes = x.get_size()[-2:]
    if outs is None:
        if all(static(n) is not None for n in sizes):
            outs = [sympy.Integer(_pool_out_size(static(n), *a, ceil_mode)) for n, *a in zip(sizes, k, s, p, d)]
        else:
            outs = _node_output_size()[-2:]
    axes = []
    for n, o, kk, ss, pp, dd in zip(sizes, outs, k, s, p, d):
        last, n_ = static(o), static(n)
        high = [last is None or n_ is None or (last - 1) * ss - pp + j * dd >= n_ for j in range(kk)]
        low = [j * dd - pp < 0 for j in range(kk)]
        axes.append(Axis(n, o, kk, lambda i, ss=ss, pp=pp: i * ss - pp, dd, low, high))
    return axes


def _node_output_size():
    node = state.current_graph().current_node
    val = node.meta.get("val") if node is not None else None
    val = val[0] if isinstance(val, (list, tuple)) else val
    if not isinstance(val, torch.Tensor):
        raise Unsupported("pooling with symbolic sizes and no output metadata")
    return [sympify(s) for s in val.shape]


def _out_size(x, axes):
    return list(x.get_size()[:-2]) + [a.out for a in axes]


# --- max pool --------------------------------------------------------------------------------------------

@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ah, aw = sliding_axes(x, kernel_size, stride, padding, dilation, ceil_mode)
    x = realize_if_costly(x, ah.taps * aw.taps)
    loader, dtype, width = x.make_loader(), x.dtype, x.get_size()[-1]
    floating = dtype.is_floating_point
    lowest = float("-inf") if floating else torch.iinfo(dtype).min

    def scan(idx):
        """(max, flat h*W + w of the max) over the window, by eager's rule: a later element wins when
        it is greater or NaN (ties keep the first, the last NaN wins), and the first element inside the
        input wins whatever it is (a window of -inf points at its first element)."""
        *batch, oh, ow = idx
        best = at = seen = None     # seen: an element inside the input was met (None: statically yes)
        for jh in range(ah.taps):
            for jw in range(aw.taps):
                inside = both(ah.valid(oh, jh), aw.valid(ow, jw))
                v = loader([*batch, ah.index(oh, jh), aw.index(ow, jw)])
                flat = ops.index_expr(ah.pos(oh, jh) * width + aw.pos(ow, jw), _I64)
                if best is None:
                    best = v if inside is None else ops.where(inside, v, ops.constant(lowest, dtype))
                    at, seen = flat, inside
                    continue
                take = ops.gt(v, best)
                if floating:
                    take = ops.logical_or(take, ops.isnan(v))
                if seen is not None:
                    take = ops.logical_or(take, ops.logical_not(seen))
                    seen = None if inside is None else ops.logical_or(seen, inside)
                take = both(inside, take)
                best, at = ops.where(take, v, best), ops.where(take, flat, at)
        return best, at

    size = _out_size(x, (ah, aw))
    values = TensorBox.pointwise(x.device, dtype, lambda idx: scan(idx)[0], size)
    indices = TensorBox.pointwise(x.device, _I64, lambda idx: scan(idx)[1], size)
    return values, indices


def _containing(axis: Axis) -> Axis:
    """The transposed axis of a sliding window: input i lies in the windows of outputs o with
    o*s - p <= i <= o*s - p + span - 1, i.e. o from ceil((i + p - span + 1) / s), at most
    (span - 1) // s + 1 of them. Positions along it are output positions."""
    s, p = axis.start(1) - axis.start(0), -axis.start(0)
    span = (axis.taps - 1) * axis.step + 1
    lift = max(0, -((p - span + s) // s))          # whole strides that keep FloorDiv's base >= 0

    def first(i):
        return FloorDiv(i + p - span + s + lift * s, s) - lift

    def past(i):                                   # one past the last window starting at or before i
        return FloorDiv(i + p, s) + 1
    count = (span - 1) // s + 1
    n, o, lo = static(axis.size), static(axis.out), int(first(sympy.Integer(0)))
    low = [lo + j < 0 for j in range(count)]
    high = [n is None or o is None or int(first(sympy.Integer(n - 1))) + j >= o for j in range(count)]
    return Axis(axis.out, axis.size, count, first, 1, low, high, end=past)


def _gather_windows(grad, axes, term, out_size):
    """Backward as a gather: input element i sums term(...) over the output windows containing it,
    in eager's order (outputs ascending). term(batch, (oh, ow), (load_h, load_w), (ih, iw), g) gives
    (contribution, extra mask or None)."""
    ch, cw = _containing(axes[0]), _containing(axes[1])
    if ch.taps * cw.taps > MAX_WINDOW:
        raise Unsupported(f"pooling backward over {ch.taps}x{cw.taps} windows")
    grad = realize_if_costly(grad, ch.taps * cw.taps)
    gl, dtype = grad.make_loader(), grad.dtype
    acc = acc_dtype(dtype)

    def inner_fn(idx):
        *batch, ih, iw = idx
        total = None
        for jh in range(ch.taps):
            oh, lh = ch.pos(ih, jh), ch.index(ih, jh)
            okh = both(in_bounds(oh, ch.size, ch.low[jh], ch.high[jh]), ch.valid(ih, jh))
            for jw in range(cw.taps):
                ow, lw = cw.pos(iw, jw), cw.index(iw, jw)
                okw = both(in_bounds(ow, cw.size, cw.low[jw], cw.high[jw]), cw.valid(iw, jw))
                value, ok = term(batch, (oh, ow), (lh, lw), (ih, iw), gl([*batch, lh, lw]))
                total = accumulate(total, masked(value, both(both(okh, okw), ok), acc))
        return cast(total, acc, dtype)
    return TensorBox.pointwise(grad.device, dtype, inner_fn, out_size)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    if list(grad.get_size()) != list(indices.get_size()) or grad.dim() != x.dim():
        raise Unsupported("max_pool2d backward with a broadcast grad")
    axes = sliding_axes(x, kernel_size, stride, padding, dilation, ceil_mode, outs=grad.get_size()[-2:])
    il, width = indices.make_loader(), x.get_size()[-1]

    def term(batch, o, load_at, i, g):
        # only the windows whose saved argmax is this element pass their gradient back
        return g, ops.eq(il([*batch, *load_at]), ops.index_expr(i[0] * width + i[1], _I64))
    return _gather_windows(grad, axes, term, x.get_size())


# --- average pools ---------------------------------------------------------------------------------------

def _avg_window_len(a: Axis, o, count_include_pad, ceil_mode):
    """Eager's divisor factor along one axis: the window clipped to the padded input (count_include_pad)
    or to the input. A sympy int where it is the same for every o."""
    first, past = a.start(o), a.start(o) + a.taps
    if count_include_pad:
        n, last, pad = static(a.size), static(a.out), -a.start(0)
        if not ceil_mode or (n is not None and last is not None and a.start(last - 1) + a.taps <= n + pad):
            return sympy.Integer(a.taps)
        return ops.sub(ops.minimum(int_value(past), int_value(a.size + pad)), int_value(first))
    if not (any(a.low) or any(a.high)):
        return sympy.Integer(a.taps)
    end = ops.minimum(int_value(past), int_value(a.size)) if any(a.high) else int_value(past)
    begin = ops.maximum(int_value(first), ops.constant(0, _I64)) if any(a.low) else int_value(first)
    return ops.sub(end, begin)


def _avg_divisor(axes, o, count_include_pad, ceil_mode, divisor_override, acc):
    if divisor_override:
        return ops.constant(float(divisor_override), acc)
    lh, lw = (_avg_window_len(a, oi, count_include_pad, ceil_mode) for a, oi in zip(axes, o))
    if isinstance(lh, sympy.Expr) and isinstance(lw, sympy.Expr):
        return ops.constant(float(lh * lw), acc)
    count = ops.mul(*(int_value(v) if isinstance(v, sympy.Expr) else v for v in (lh, lw)))
    # >= 1 for every real window; the floor keeps a backward's masked-out candidates from dividing by 0
    return ops.to_dtype(ops.maximum(count, ops.constant(1, _I64)), acc, _I64)


def _avg_axes(x, kernel_size, stride, padding, ceil_mode, divisor_override, outs=None):
    if not x.dtype.is_floating_point:
        raise Unsupported("avg_pool2d of integers")
    if divisor_override is not None and divisor_override == 0:
        raise Unsupported("divisor_override=0")
    return sliding_axes(x, kernel_size, stride, padding, 1, ceil_mode, outs)


def _window_value(loader, axes, batch, oh, ow, jh, jw, acc):
    """x at tap (jh, jw) of the window of output (oh, ow); 0 where the tap falls outside x."""
    ah, aw = axes
    v = loader([*batch, ah.index(oh, jh), aw.index(ow, jw)])
    return masked(v, both(ah.valid(oh, jh), aw.valid(ow, jw)), acc)


def _window_sum(loader, axes, batch, oh, ow, acc):
    """The sum of x over the window of output (oh, ow), taps in row-major order."""
    total = None
    for jh in range(axes[0].taps):
        for jw in range(axes[1].taps):
            total = accumulate(total, _window_value(loader, axes, batch, oh, ow, jh, jw, acc))
    return total


@lower(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    ah, aw = _avg_axes(x, kernel_size, stride, padding, ceil_mode, divisor_override)
    x = realize_if_costly(x, ah.taps * aw.taps)
    loader, dtype = x.make_loader(), x.dtype
    acc = acc_dtype(dtype)

    def inner_fn(idx):
        *batch, oh, ow = idx
        total = _window_sum(loader, (ah, aw), batch, oh, ow, acc)
        div = _avg_divisor((ah, aw), (oh, ow), count_include_pad, ceil_mode, divisor_override, acc)
        return cast(ops.truediv(total, div), acc, dtype)
    return TensorBox.pointwise(x.device, dtype, inner_fn, _out_size(x, (ah, aw)))


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    if grad.dim() != x.dim():
        raise Unsupported("avg_pool2d backward with a broadcast grad")
    axes = _avg_axes(x, kernel_size, stride, padding, ceil_mode, divisor_override, outs=grad.get_size()[-2:])
    acc = acc_dtype(grad.dtype)

    def term(batch, o, load_at, i, g):
        return ops.truediv(g, _avg_divisor(axes, o, count_include_pad, ceil_mode, divisor_override, acc)), None
    return _gather_windows(grad, axes, term, x.get_size())


def adaptive_axis(n: int, o: int) -> Axis:
    """Eager's adaptive windows of n inputs for o outputs: output i covers [floor(i*n/o), ceil((i+1)*n/o)).
    Transposed (n and o swapped) it gives the outputs whose windows contain an input."""
    lens = [-(-(i + 1) * n // o) - i * n // o for i in range(o)]
    taps = max(lens)
    high = [any(i * n // o + j >= n for i in range(o)) for j in range(taps)]
    end = None if min(lens) == taps else (lambda i: FloorDiv((i + 1) * n + o - 1, o))
    return Axis(sympy.Integer(n), sympy.Integer(o), taps, lambda i: FloorDiv(i * n, o), 1,
                [False] * taps, high, end)


def _adaptive_axes(x, output_size):
    if x.dim() not in (3, 4):
        raise Unsupported(f"adaptive pooling of a {x.dim()}-D tensor")
    sizes = [static(v) for v in list(x.get_size()[-2:]) + list(output_size)]
    if any(v is None or v <= 0 for v in sizes):
        raise Unsupported("adaptive pooling with symbolic or empty sizes")
    return [adaptive_axis(sizes[0], sizes[2]), adaptive_axis(sizes[1], sizes[3])]


def _div_by(v, n, acc):
    return ops.truediv(v, ops.constant(float(n), acc) if isinstance(n, sympy.Expr) else ops.to_dtype(n, acc, _I64))


def _adaptive_mean(total, axes, oh, ow, acc):
    return _div_by(_div_by(total, axes[0].length(oh), acc), axes[1].length(ow), acc)   # eager: sum / kh / kw


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    if not x.dtype.is_floating_point:
        raise Unsupported("adaptive_avg_pool2d of integers")
    ah, aw = axes = _adaptive_axes(x, output_size)
    dtype, acc, size = x.dtype, acc_dtype(x.dtype), _out_size(x, axes)
    big = ah.taps * aw.taps > MAX_WINDOW
    if not big:
        x = realize_if_costly(x, ah.taps * aw.taps)
    loader = x.make_loader()

    if big:
        # a big window is a reduction over it (pooling down to a few outputs)
        def body(idx, ridx):
            return _window_value(loader, axes, idx[:-2], idx[-2], idx[-1], ridx[0], ridx[1], acc)
        sums = TensorBox(Reduction(x.device, acc, body, size, [sympy.Integer(ah.taps), sympy.Integer(aw.taps)],
                                   "sum", acc))
        sums.realize()
        sl = sums.make_loader()
        return TensorBox.pointwise(
            x.device, dtype, lambda idx: cast(_adaptive_mean(sl(idx), axes, idx[-2], idx[-1], acc), acc, dtype), size)

    def inner_fn(idx):
        *batch, oh, ow = idx
        return cast(_adaptive_mean(_window_sum(loader, axes, batch, oh, ow, acc), axes, oh, ow, acc), acc, dtype)
    return TensorBox.pointwise(x.device, dtype, inner_fn, size)


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    if grad.dim() != x.dim():
        raise Unsupported("adaptive_avg_pool2d backward with a broadcast grad")
    axes = _adaptive_axes(x, grad.get_size()[-2:])
    inv = [adaptive_axis(int(a.out), int(a.size)) for a in axes]
    if inv[0].taps * inv[1].taps > MAX_WINDOW:
        raise Unsupported("adaptive_avg_pool2d backward with many windows per element")
    grad = realize_if_costly(grad, inv[0].taps * inv[1].taps)
    gl, dtype = grad.make_loader(), grad.dtype
    acc = acc_dtype(dtype)

    def inner_fn(idx):
        *batch, ih, iw = idx
        total = None
        for jh in range(inv[0].taps):
            oh = inv[0].pos(ih, jh)
            for jw in range(inv[1].taps):
                ow = inv[1].pos(iw, jw)
                g = gl([*batch, inv[0].index(ih, jh), inv[1].index(iw, jw)])
                # eager adds grad / kh / kw of each window, in window order
                g = _adaptive_mean(g, axes, oh, ow, acc)
                total = accumulate(total, masked(g, both(inv[0].valid(ih, jh), inv[1].valid(iw, jw)), acc))
        return cast(total, acc, dtype)
    return TensorBox.pointwise(grad.device, dtype, inner_fn, x.get_size())
