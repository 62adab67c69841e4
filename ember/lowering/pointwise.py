"""Elementwise ops: broadcasting, PyTorch's type promotion, and one short lowering per ATen op.

Values inside kernels of float16/bfloat16 tensors are computed in float32 (the kernel handler widens on
load and narrows on store); `to_dtype` to a narrow float rounds right there, as eager would.
"""
from __future__ import annotations

import functools
import math

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from ..ir.nodes import TensorBox
from ..ir.ops import ops
from ..ir.symbolic import has_division
from .registry import Unsupported, lower

aten = torch.ops.aten
prims = torch.ops.prims


# --- helpers shared by lowerings ----------------------------------------------------------------------

def is_tensor(x) -> bool:
    return isinstance(x, TensorBox)


def broadcast_shapes(*shapes):
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        size = sympy.Integer(1)
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            if s[j] != 1:
                size = s[j]
        out.append(size)
    return out


def broadcast_loader(x: TensorBox, out_size):
    """Loader of x indexed by an index over out_size (x broadcast to it)."""
    size = x.get_size()
    loader = x.make_loader()
    offset = len(out_size) - len(size)
    broadcast = [s == 1 and out_size[i + offset] != 1 for i, s in enumerate(size)]

    def load(idx):
        return loader([sympy.Integer(0) if b else idx[i + offset] for i, b in enumerate(broadcast)])
    return load


def _promotion_arg(x):
    if is_tensor(x):
        return torch.empty([1] * x.dim() if x.dim() else [], dtype=x.dtype, device="meta")
    if isinstance(x, sympy.Expr):
        return 1 if x.is_integer else 1.0
    return x


# promote's answers: type promotion reads only the tensors' dtypes and dimensions, the scalars' types and
# the default dtype, while building its meta tensors costs a fake-tensor dispatch each
_promotions: dict = {}


def promote(args, kind=KIND.DEFAULT):
    """(compute dtype for the inputs, result dtype) for elementwise args under `kind`."""
    key = (kind, torch.get_default_dtype(),
           tuple(("t", a.dtype, a.dim()) if is_tensor(a) else ("s", type(_promotion_arg(a)))
                 for a in args if a is not None))
    if key not in _promotions:
        _promotions[key] = _promote(args, kind)
    return _promotions[key]


def _promote(args, kind):
    vals = [_promotion_arg(a) for a in args if a is not None]
    _, result = elementwise_dtypes(*vals, type_promotion_kind=kind)
    if kind == KIND.ALWAYS_BOOL:
        return elementwise_dtypes(*vals, type_promotion_kind=KIND.DEFAULT)[1], result
    return result, result


def scalar_value(x, dtype):
    """ops value of a python scalar or size expression x, as dtype. A quotient of sizes (a SymFloat such as
    an interpolation's scale `s / 10`) is Python's true division, computed in float64 as Python does and
    then converted: printed as an index it would divide as integers."""
    if isinstance(x, sympy.Expr):
        if x.is_Integer:
            return ops.constant(int(x), dtype)
        if x.is_Number:
            return ops.constant(float(x), dtype)
        if has_division(x):
            if not dtype.is_floating_point:
                raise Unsupported(f"size quotient {x} as {dtype}")
            num, den = sympy.fraction(sympy.together(x))
            quotient = ops.truediv(ops.index_expr(num, torch.float64), ops.index_expr(den, torch.float64))
            return cast(quotient, torch.float64, dtype)
        if x.is_integer is False:
            raise Unsupported(f"non-integer size expression {x}")
        return index_value(x, dtype)
    return ops.constant(x, dtype)


def index_value(expr, dtype):
    """ops value of an integer index expression, as dtype (to a narrow float through int64, as casts go)."""
    if dtype in (torch.float16, torch.bfloat16):
        return cast(ops.index_expr(expr, torch.int64), torch.int64, dtype)
    return ops.index_expr(expr, dtype)


def cast(value, src, dst):
    if src == dst:
        return value
    if dst in (torch.float16, torch.bfloat16) and not src.is_floating_point:
        # eager converts integers to a narrow float through float32 (c10::convert)
        value, src = ops.to_dtype(value, torch.float32, src), torch.float32
    return ops.to_dtype(value, dst, src)


def canonical_device(device) -> torch.device:
    """A device argument as the tensors on it report it: `cuda` names the current GPU, and ember compares
    devices to decide what may share a kernel (a `cuda` constant must meet `cuda:0` tensors)."""
    d = torch.device(device) if device is not None else torch.device("cpu")
    if d.index is None and d.type != "cpu":
        mod = getattr(torch, d.type, None)
        if mod is not None and hasattr(mod, "current_device") and mod.is_available():
            d = torch.device(d.type, mod.current_device())
    return d


def single_device(tensors):
    """The device all tensors are on. Eager also takes a 0-dim CPU tensor with CUDA ones (read as a
    scalar); a kernel cannot load it, so that case runs as an ATen fallback."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise Unsupported("tensors on several devices")
    return next(iter(devices))


def pointwise(fn, *args, kind=KIND.DEFAULT, out_dtype=None, compute_dtype=None):
    """Build the Pointwise computing fn(*values) elementwise over the broadcast of the tensor args."""
    tensors = [a for a in args if is_tensor(a)]
    if not tensors:
        raise Unsupported("pointwise op without tensor args")
    device = single_device(tensors)
    compute, result = promote(args, kind)
    compute = compute_dtype or compute
    result = out_dtype or result
    size = broadcast_shapes(*[t.get_size() for t in tensors])
    loaders = [(broadcast_loader(a, size), a.dtype) if is_tensor(a) else a for a in args]

    def inner_fn(idx):
        vals = [cast(l[0](idx), l[1], compute) if isinstance(l, tuple) else
                (None if l is None else scalar_value(l, compute)) for l in loaders]
        return cast(fn(*vals), _fn_dtype(kind, compute), result)

    return TensorBox.pointwise(device, result, inner_fn, size)


def _fn_dtype(kind, compute):
    return torch.bool if kind == KIND.ALWAYS_BOOL else compute


def register_pointwise(op, fn, kind=KIND.DEFAULT, **kw):
    @lower(op)
    def lowering(*args, **kwargs):
        if kwargs:
            raise Unsupported(f"kwargs {list(kwargs)}")
        return pointwise(fn, *args, kind=kind, **kw)
    return lowering


# --- the op table ---------------------------------------------------------------------------------------

_UNARY_FLOAT = {  # ops that turn integers into floats
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin",
    aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh", aten.asinh: "asinh", aten.acosh: "acosh",
    aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc", aten.erfinv: "erfinv", aten.sigmoid: "sigmoid",
    aten.lgamma: "lgamma", aten.reciprocal: "reciprocal",
}
for _op, _name in _UNARY_FLOAT.items():
    register_pointwise(_op, (lambda n: lambda x: getattr(ops, n)(x))(_name), kind=KIND.INT_TO_FLOAT)

_UNARY_SAME = {aten.neg: "neg", aten.abs: "abs", aten.sign: "sign", aten.square: "square", aten.relu: "relu"}
for _op, _name in _UNARY_SAME.items():
    register_pointwise(_op, (lambda n: lambda x: getattr(ops, n)(x))(_name))


def _int_passthrough(name):
    def fn(x):
        return getattr(ops, name)(x)
    return fn


for _op, _name in {aten.floor: "floor", aten.ceil: "ceil", aten.trunc: "trunc"}.items():
    @lower(_op)
    def _rounding(x, _name=_name):
        if not x.dtype.is_floating_point:
            return pointwise(lambda v: v, x)
        return pointwise(_int_passthrough(_name), x)


@lower(aten.round.default)
def round_(x):
    if not x.dtype.is_floating_point:
        return pointwise(lambda v: v, x)
    return pointwise(ops.round, x)


@lower(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    if not x.dtype.is_floating_point:
        raise Unsupported("round with decimals of an integer tensor")
    if decimals == 0:
        return round_(x)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale = float(10 ** abs(decimals))

    def fn(v):
        c = ops.constant(scale, compute)
        if decimals < 0:  # as eager: nearbyint(x / 10^-d) * 10^-d
            return ops.mul(ops.round(ops.truediv(v, c)), c)
        return ops.truediv(ops.round(ops.mul(v, c)), c)
    return pointwise(fn, x)


@lower(aten.bitwise_not)
def bitwise_not(x):
    if x.dtype == torch.bool:
        return pointwise(ops.logical_not, x)
    return pointwise(ops.bitwise_not, x)


register_pointwise(aten.logical_not, lambda x: ops.logical_not(x), kind=KIND.ALWAYS_BOOL)
register_pointwise(aten.isnan, lambda x: ops.isnan(x), kind=KIND.ALWAYS_BOOL)
register_pointwise(aten.isinf, lambda x: ops.isinf(x), kind=KIND.ALWAYS_BOOL)
register_pointwise(aten.signbit, lambda x: ops.signbit(x), kind=KIND.ALWAYS_BOOL)


@lower(aten.isfinite)
def isfinite(x):
    if not x.dtype.is_floating_point:
        return pointwise(lambda v: ops.eq(v, v), x, kind=KIND.ALWAYS_BOOL)
    return pointwise(lambda v: ops.logical_not(ops.logical_or(ops.isnan(v), ops.isinf(v))), x, kind=KIND.ALWAYS_BOOL)


def _binary(name):
    return lambda a, b: getattr(ops, name)(a, b)


def _alpha(name, bool_name=None):
    """add/sub with `alpha` (a keyword of the .Tensor overloads, positional in the .Scalar ones)."""
    def lowering(a, b, alpha=None):
        compute, _ = promote([a, b])
        if compute == torch.bool:
            if bool_name is None or alpha not in (None, 1, True):
                raise Unsupported(f"{name} of booleans")
            return pointwise(_binary(bool_name), a, b)
        if alpha is None or alpha == 1:
            return pointwise(_binary(name), a, b)
        return pointwise(lambda x, y, al: getattr(ops, name)(x, ops.mul(y, al)), a, b, alpha)
    return lowering


lower(aten.add.Tensor, aten.add.Scalar)(_alpha("add", "logical_or"))
lower(aten.sub.Tensor, aten.sub.Scalar)(_alpha("sub"))


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=None):
    """b - alpha * a (b may be a python scalar)."""
    if alpha is None or alpha == 1:
        return pointwise(lambda x, y: ops.sub(y, x), a, b)
    return pointwise(lambda x, y, al: ops.sub(y, ops.mul(x, al)), a, b, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    compute, _ = promote([a, b])
    return pointwise(_binary("logical_and" if compute == torch.bool else "mul"), a, b)


for _op, _name in {aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2", aten.hypot: "hypot",
                   aten.copysign: "copysign", aten.fmod: "fmod", aten.remainder: "remainder",
                   aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
                   aten.bitwise_xor: "bitwise_xor"}.items():
    kind = KIND.INT_TO_FLOAT if _name in ("atan2", "hypot", "copysign") else KIND.DEFAULT
    register_pointwise(_op, _binary(_name), kind=kind)


def _shift(left: bool):
    """Eager's shifts: a shift by a negative amount or by >= the bit width gives 0 (left) or the sign
    fill a >> (bits - 1) (right); Triton leaves those undefined."""
    def fn(x, y, dtype):
        bits = ops.constant(torch.iinfo(dtype).bits, dtype)
        zero = ops.constant(0, dtype)
        bad = ops.ge(y, bits)
        if dtype.is_signed:
            bad = ops.logical_or(bad, ops.lt(y, zero))
        safe = ops.where(bad, zero, y)
        if left:
            return ops.where(bad, zero, ops.bitwise_left_shift(x, safe))
        fill = ops.bitwise_right_shift(x, ops.constant(torch.iinfo(dtype).bits - 1, dtype))
        return ops.where(bad, fill, ops.bitwise_right_shift(x, safe))

    def lowering(a, b):
        compute, _ = promote([a, b])
        if compute.is_floating_point or compute == torch.bool:
            raise Unsupported(f"shift of {compute}")
        return pointwise(lambda x, y: fn(x, y, compute), a, b)
    return lowering


lower(aten.bitwise_left_shift, aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift(True))
lower(aten.bitwise_right_shift, aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_shift(False))

for _op, _name in {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge",
                   aten.logical_and: "logical_and", aten.logical_or: "logical_or",
                   aten.logical_xor: "logical_xor"}.items():
    register_pointwise(_op, _binary(_name), kind=KIND.ALWAYS_BOOL)


@lower(aten.div.Tensor, aten.div.Scalar)
def div(a, b):
    return pointwise(ops.truediv, a, b, kind=KIND.INT_TO_FLOAT)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    compute, result = promote([a, b])
    if rounding_mode == "floor":
        return floor_divide(a, b)
    if rounding_mode != "trunc":
        raise Unsupported(f"rounding_mode={rounding_mode!r}")
    if compute.is_floating_point:
        def fn(x, y):
            q = ops.truediv(x, y)
            if compute in (torch.float16, torch.bfloat16):
                # eager rounds the quotient to the narrow dtype before truncating (Half / Half is a Half);
                # inside kernels narrow values are float32, so round explicitly
                q = ops.to_dtype(q, compute, torch.float32)
            return ops.trunc(q)
        return pointwise(fn, a, b)
    raise Unsupported("integer division with rounding_mode='trunc'")


def _floordiv_float(x, y, dtype):
    """Python's (and eager's) floor division of floats: c10::div_floor_floating. floor(x / y) is not it:
    1.0 // 0.1 is 9.0 while 1.0 / 0.1 rounds to 10.0."""
    zero, one = ops.constant(0.0, dtype), ops.constant(1.0, dtype)
    mod = ops.fmod(x, y)
    quot = ops.truediv(ops.sub(x, mod), y)
    fix = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(y, zero), ops.lt(mod, zero)))
    quot = ops.where(fix, ops.sub(quot, one), quot)
    fl = ops.floor(quot)
    fl = ops.where(ops.gt(ops.sub(quot, fl), ops.constant(0.5, dtype)), ops.add(fl, one), fl)
    true_quot = ops.truediv(x, y)
    fl = ops.where(ops.ne(quot, zero), fl, ops.mul(true_quot, zero))  # a signed zero, as copysign(0, x / y)
    return ops.where(ops.eq(y, zero), true_quot, fl)


@lower(aten.floor_divide)
def floor_divide(a, b):
    compute, _ = promote([a, b])
    if compute == torch.bool:
        raise Unsupported("floor division of booleans")
    if compute.is_floating_point:
        # halves are divided in float32 and rounded once, as eager's div_floor for reduced floats does
        return pointwise(lambda x, y: _floordiv_float(x, y, compute), a, b)
    return pointwise(ops.floordiv, a, b)


@lower(aten.true_divide)
def true_divide(a, b):
    return div(a, b)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(a, b):
    if not is_tensor(b) and not isinstance(b, sympy.Expr) and is_tensor(a):
        if b == 2:
            return pointwise(lambda x, _: ops.mul(x, x), a, b)
        if b == 1:
            return pointwise(lambda x, _: x, a, b)
        if b == 0.5 and a.dtype.is_floating_point:
            return pointwise(lambda x, _: ops.sqrt(x), a, b)
        if b == -1 and a.dtype.is_floating_point:
            return pointwise(lambda x, _: ops.reciprocal(x), a, b)
        if b == 3:
            return pointwise(lambda x, _: ops.mul(ops.mul(x, x), x), a, b)
    compute, _ = promote([a, b])
    if not compute.is_floating_point:
        raise Unsupported("integer pow")
    return pointwise(ops.pow, a, b)


@lower(aten.where.self)
def where(cond, a, b):
    compute, result = promote([a, b])
    size = broadcast_shapes(*[t.get_size() for t in (cond, a, b) if is_tensor(t)])
    cl = broadcast_loader(cond, size)
    loaders = [(broadcast_loader(x, size), x.dtype) if is_tensor(x) else x for x in (a, b)]

    def value(l, idx):
        return cast(l[0](idx), l[1], result) if isinstance(l, tuple) else scalar_value(l, result)

    def inner_fn(idx):
        c = cast(cl(idx), cond.dtype, torch.bool)
        return ops.where(c, value(loaders[0], idx), value(loaders[1], idx))

    return TensorBox.pointwise(single_device([t for t in (cond, a, b) if is_tensor(t)]), result, inner_fn, size)


def _clamp_fn(lo, hi):
    def fn(x, *bounds):
        it = iter(bounds)
        if lo is not None:
            x = ops.maximum(x, next(it))
        if hi is not None:
            x = ops.minimum(x, next(it))
        return x
    return fn


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    bounds = [b for b in (min, max) if b is not None]
    return pointwise(_clamp_fn(min, max), x, *bounds)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return clamp(x, min=min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return clamp(x, max=max)


@lower(aten.hardtanh.default)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    if not x.dtype.is_floating_point:
        # eager keeps the integer dtype and converts the bounds to it (truncating)
        min_val, max_val = int(min_val), int(max_val)
    return clamp(x, min_val, max_val)


# tanh-GELU's argument u = k (v + c v^3)
_GELU_K, _GELU_C = math.sqrt(2 / math.pi), 0.044715


def _gelu_cdf(v, dt):
    """Phi(v) = 0.5 (1 + erf(v / sqrt(2))), exact GELU's factor, computed in dt (its constants too: a
    float32 sqrt(0.5) would cost float64 GELU eight digits)."""
    c = functools.partial(ops.constant, dtype=dt)
    return ops.mul(c(0.5), ops.add(c(1.0), ops.erf(ops.mul(v, c(math.sqrt(0.5))))))


def _gelu_tanh_arg(v, v2, scale: float, dt):
    """scale * u for tanh-GELU (v2 = v * v), in dt."""
    return ops.mul(ops.constant(scale * _GELU_K, dt), ops.add(v, ops.mul(ops.constant(_GELU_C, dt), ops.mul(v2, v))))


@lower(aten.gelu.default)
def gelu(x, *, approximate="none"):
    dt, _ = promote([x], KIND.INT_TO_FLOAT)
    if approximate == "tanh":
        # 0.5 v (1 + tanh(u)) = v sigmoid(2u) = v / (1 + exp(-2u)): one exp and a division instead of a tanh,
        # which costs several times more where it runs at a GEMM epilogue's occupancy (docs/performance.md,
        # "GEMM epilogues"), and no cancellation in 1 + tanh(u) for negative v
        def fn(v):
            minus_2u = _gelu_tanh_arg(v, ops.mul(v, v), -2.0, dt)
            return ops.truediv(v, ops.add(ops.constant(1.0, dt), ops.exp(minus_2u)))
    else:
        def fn(v):          # v Phi(v); scaling by 0.5 is exact, so this is 0.5 v (1 + erf(v / sqrt(2)))
            return ops.mul(v, _gelu_cdf(v, dt))
    return pointwise(fn, x, kind=KIND.INT_TO_FLOAT)


@lower(aten.gelu_backward.default)
def gelu_backward(grad, x, *, approximate="none"):
    dt, _ = promote([grad, x], KIND.INT_TO_FLOAT)
    c = functools.partial(ops.constant, dtype=dt)
    if approximate == "tanh":
        # gelu(v) = v s with s = sigmoid(2u), u = k (v + c v^3): the gradient is g (s + 2 v u' s (1 - s)),
        # u' = k (1 + 3 c v^2). With q = exp(-2|u|) (never overflows) and r = 1 / (1 + q): s is r or q r by
        # the sign of u, and s (1 - s) = q r^2 either way, free of the cancellation in torch's 1 - tanh(u)^2
        def fn(g, v):
            v2 = ops.mul(v, v)
            u = _gelu_tanh_arg(v, v2, 1.0, dt)
            q = ops.exp(ops.mul(c(-2.0), ops.abs(u)))
            r = ops.truediv(c(1.0), ops.add(c(1.0), q))
            s = ops.where(ops.ge(u, c(0.0)), r, ops.mul(q, r))
            du = ops.mul(c(_GELU_K), ops.add(c(1.0), ops.mul(c(3 * _GELU_C), v2)))
            slope = ops.mul(ops.mul(c(2.0), ops.mul(v, du)), ops.mul(q, ops.mul(r, r)))
            return ops.mul(g, ops.add(s, slope))
    else:
        # d/dv [v Phi(v)] = Phi(v) + v phi(v)
        def fn(g, v):
            pdf = ops.mul(c(1 / math.sqrt(2 * math.pi)), ops.exp(ops.mul(c(-0.5), ops.mul(v, v))))
            return ops.mul(g, ops.add(_gelu_cdf(v, dt), ops.mul(v, pdf)))
    return pointwise(fn, grad, x, kind=KIND.INT_TO_FLOAT)


@lower(aten.silu.default)
def silu(x):
    return pointwise(lambda v: ops.mul(v, ops.sigmoid(v)), x, kind=KIND.INT_TO_FLOAT)


@lower(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return pointwise(lambda v, s: ops.where(ops.gt(v, ops.constant(0, torch.float32)), v, ops.mul(v, s)),
                     x, negative_slope)


@lower(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    compute, result = promote([grad, x])
    return pointwise(lambda g, v, t: ops.where(ops.le(v, t), ops.constant(0, compute), g), grad, x, threshold)


@lower(aten.threshold.default)
def threshold(x, threshold, value):
    return pointwise(lambda v, t, val: ops.where(ops.le(v, t), val, v), x, threshold, value)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(a, b, w):
    return pointwise(lambda x, y, ww: ops.add(x, ops.mul(ww, ops.sub(y, x))), a, b, w)


@lower(aten.addcmul.default)
def addcmul(x, a, b, *, value=1):
    return pointwise(lambda s, t1, t2, v: ops.add(s, ops.mul(v, ops.mul(t1, t2))), x, a, b, value)


@lower(aten.addcdiv.default)
def addcdiv(x, a, b, *, value=1):
    return pointwise(lambda s, t1, t2, v: ops.add(s, ops.mul(v, ops.truediv(t1, t2))), x, a, b, value)


@lower(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not x.dtype.is_floating_point:
        return pointwise(lambda v: v, x)
    info = torch.finfo(x.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    dtype = x.dtype

    def fn(v):
        zero = ops.constant(0, dtype)
        v = ops.where(ops.isnan(v), ops.constant(nan, dtype), v)
        v = ops.where(ops.logical_and(ops.isinf(v), ops.gt(v, zero)), ops.constant(posinf, dtype), v)
        return ops.where(ops.logical_and(ops.isinf(v), ops.lt(v, zero)), ops.constant(neginf, dtype), v)
    return pointwise(fn, x)


# --- casts and copies ------------------------------------------------------------------------------------

def to_dtype(x: TensorBox, dtype: torch.dtype) -> TensorBox:
    loader, src = x.make_loader(), x.dtype
    box = TensorBox.pointwise(x.device, dtype, lambda idx: cast(loader(idx), src, dtype), x.get_size())
    if src.is_floating_point and dtype.is_floating_point and x.is_realized():
        # a float cast of a stored value (autocast's cast of a weight): a GEMM template may read the stored
        # value and cast its tile instead (lowering/matmul.py, a prologue)
        box.data.cast_of = x
    return box


@lower(prims.convert_element_type.default)
def convert_element_type(x, dtype):
    return to_dtype(x, dtype)


@lower(aten._to_copy.default)
def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and canonical_device(device) != x.device:
        raise Unsupported("device copy")
    if layout not in (None, torch.strided):
        raise Unsupported("layout change")
    return to_dtype(x, dtype or x.dtype)


@lower(aten.clone.default)
def clone(x, *, memory_format=None):
    return to_dtype(x, x.dtype)


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return to_dtype(x, x.dtype)
