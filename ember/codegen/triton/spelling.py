"""Triton spellings of the math ops, as a mixin of the Triton kernel handler.

Values of float16/bfloat16 tensors are float32 inside kernels; a cast to a narrow float rounds and
widens again, so later math stays in float32 exactly as the rounded eager value would.
"""
from __future__ import annotations

import torch

from ..kernel import KValue, literal, widest_kind

_TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def triton_type(dtype: torch.dtype) -> str:
    try:
        return _TRITON_TYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"no Triton type for {dtype}") from None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# name -> (format, result is bool). {0}, {1} are operands.
_UNARY = {
    "neg": "-{0}", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})", "log": "tl.log({0})", "log2": "tl.log2({0})", "log10": "libdevice.log10({0})",
    "log1p": "libdevice.log1p({0})", "sqrt": "libdevice.sqrt({0})", "rsqrt": "libdevice.rsqrt({0})",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tan": "libdevice.tan({0})", "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})", "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "tanh": "libdevice.tanh({0})", "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})",
    "erfc": "libdevice.erfc({0})", "erfinv": "libdevice.erfinv({0})", "sigmoid": "tl.sigmoid({0})",
    "floor": "libdevice.floor({0})", "ceil": "libdevice.ceil({0})", "trunc": "libdevice.trunc({0})",
    "round": "libdevice.nearbyint({0})", "reciprocal": "(1.0 / {0})", "square": "({0} * {0})",
    "lgamma": "libdevice.lgamma({0})", "relu": "tl.where({0} < 0, 0, {0})",
}
# unary ops of a few instructions; the others (exp, log, sin, erf, ...) make a kernel math-heavy: its
# launch config then gives each thread more elements (heuristics.launch_config)
_CHEAP_UNARY = {"neg", "abs", "sqrt", "rsqrt", "floor", "ceil", "trunc", "round", "reciprocal", "square", "relu"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
          "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LIBDEVICE_BINARY = {"pow": "pow", "atan2": "atan2", "hypot": "hypot", "copysign": "copysign", "fmod": "fmod"}


def _is_int(v) -> bool:
    return isinstance(v, KValue) and not v.dtype.is_floating_point and v.dtype != torch.bool


class TritonSpelling:
    """Mixin: needs `self.cse(expr, dtype, kind)`."""

    math_heavy = False          # set once the kernel computes a transcendental function

    def _op(self, expr: str, dtype, *vals) -> KValue:
        kind = widest_kind(*vals)
        if kind == "const":
            kind = "scalar"
        return self.cse(expr, dtype, kind, deps=vals)

    def constant(self, value, dtype) -> KValue:
        if dtype == torch.bool:
            return KValue(f"tl.full([], {bool(value)!r}, tl.int1)", torch.bool, "const")
        cdt = compute_dtype(dtype)
        if cdt.is_floating_point:
            value = float(value)
            if cdt == torch.float32:
                return KValue(literal(value), cdt, "const")
        else:
            value = int(value)
            if cdt == torch.int32 and -2 ** 31 <= value < 2 ** 31:
                return KValue(literal(value), cdt, "const")
        return KValue(f"tl.full([], {literal(value)}, {triton_type(cdt)})", cdt, "const")

    def to_dtype(self, x: KValue, dtype, src_dtype=None) -> KValue:
        if dtype == torch.bool:
            return self._op(f"({x} != 0)", torch.bool, x)
        cdt = compute_dtype(dtype)
        if x.dtype == cdt and cdt == dtype:
            return x
        if dtype != cdt:  # narrow float: round there, compute on in float32
            return self._op(f"{_cast(x, dtype)}.to(tl.float32)", cdt, x)
        return self._op(_cast(x, cdt), cdt, x)

    def where(self, cond, a, b) -> KValue:
        dtype = a.dtype if isinstance(a, KValue) else b.dtype
        return self._op(f"tl.where({cond}, {a}, {b})", dtype, cond, a, b)

    def erf(self, x: KValue) -> KValue:
        # float32: a branchless polynomial (helpers.erf_f32); libdevice's erff cost add+GELU 1.2x on an H200
        fn = "helpers.erf_f32" if x.dtype == torch.float32 else "libdevice.erf"
        self.math_heavy = True
        return self._op(f"{fn}({x})", x.dtype, x)

    def __getattr__(self, name):
        if name in _UNARY:
            fmt = _UNARY[name]
            if name not in _CHEAP_UNARY:
                self.math_heavy = True
            return lambda x: self._op(fmt.format(x), x.dtype, x)
        if name in _INFIX:
            sym = _INFIX[name]
            return lambda a, b: self._op(f"({a} {sym} {b})", _dtype(a, b), a, b)
        if name in _COMPARE:
            sym = _COMPARE[name]
            return lambda a, b: self._op(f"({a} {sym} {b})", torch.bool, a, b)
        if name in _LIBDEVICE_BINARY:
            fn = _LIBDEVICE_BINARY[name]
            return lambda a, b: self._binary_math(fn, a, b)
        raise AttributeError(name)

    def rand(self, seed, offset):
        return self._op(f"tl.rand({seed}, {_as_tensor(offset)})", torch.float32, seed, offset)

    def randn(self, seed, offset):
        return self._op(f"tl.randn({seed}, {_as_tensor(offset)})", torch.float32, seed, offset)

    def randint64(self, seed, offset, low, high):
        return self._op(f"helpers.randint64({seed}, {_as_tensor(offset)}, {_as_tensor(low)}, {_as_tensor(high)})",
                        torch.int64, seed, offset, low, high)

    def _binary_math(self, fn, a, b):
        if fn == "fmod" and _is_int(a):
            return self._op(f"({a} % {b})", a.dtype, a, b)
        return self._op(f"libdevice.{fn}({_as_tensor(a)}, {_as_tensor(b)})", _dtype(a, b), a, b)

    def maximum(self, a, b):
        fn = "helpers.max_int" if _is_int(a) or a.dtype == torch.bool else "helpers.max_nan"
        return self._op(f"{fn}({a}, {b})", _dtype(a, b), a, b)

    def minimum(self, a, b):
        fn = "helpers.min_int" if _is_int(a) or a.dtype == torch.bool else "helpers.min_nan"
        return self._op(f"{fn}({a}, {b})", _dtype(a, b), a, b)

    def floordiv(self, a, b):
        if _is_int(a):
            return self._op(f"helpers.floordiv_int({a}, {b})", a.dtype, a, b)
        return self._op(f"libdevice.floor({a} / {b})", a.dtype, a, b)

    def remainder(self, a, b):
        if _is_int(a):
            return self._op(f"helpers.remainder_int({a}, {b})", a.dtype, a, b)
        r = self._binary_math("fmod", a, b)
        return self._op(f"helpers.remainder_float({a}, {b}, {r})", a.dtype, a, b, r)

    def sign(self, x):
        if x.dtype == torch.bool:
            return x
        return self._op(f"(({x} > 0).to({triton_type(x.dtype)}) - ({x} < 0).to({triton_type(x.dtype)}))", x.dtype, x)

    def signbit(self, x):
        if not x.dtype.is_floating_point:
            return self._op(f"({x} < 0)", torch.bool, x)
        return self._op(f"(libdevice.signbit({x}) != 0)", torch.bool, x)

    def isnan(self, x):
        return self._op(f"({x} != {x})", torch.bool, x)

    def isinf(self, x):
        return self._op(f"(tl.abs({x}) == float(\"inf\"))", torch.bool, x)

    def logical_not(self, x):
        return self._op(f"({x} == 0)", torch.bool, x)

    def bitwise_not(self, x):
        return self._op(f"(~{x})", x.dtype, x)

    def _logical(self, sym, a, b):
        return self._op(f"(({a} != 0) {sym} ({b} != 0))", torch.bool, a, b)

    def logical_and(self, a, b):
        return self._logical("&", a, b)

    def logical_or(self, a, b):
        return self._logical("|", a, b)

    def logical_xor(self, a, b):
        return self._logical("^", a, b)


def _dtype(a, b):
    for v in (a, b):
        if isinstance(v, KValue) and v.kind != "const":
            return v.dtype
    return a.dtype if isinstance(a, KValue) else b.dtype


def _cast(x: KValue, dtype) -> str:
    if x.kind == "const" and not x.name.startswith("tl."):
        return f"tl.full([], {x.name}, {triton_type(x.dtype)}).to({triton_type(dtype)})"
    return f"{x.name}.to({triton_type(dtype)})"


def _as_tensor(v: KValue) -> str:
    # libdevice wants tensors; a float literal becomes a 0-d float32 tensor
    if v.kind == "const" and not v.name.startswith("tl."):
        return f"tl.full([], {v.name}, {triton_type(v.dtype)})"
    return v.name
