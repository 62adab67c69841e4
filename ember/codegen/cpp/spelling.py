"""C++ spellings of the math ops, as a mixin of the C++ kernel handler.

Every value is a typed local (`float tmp3 = ...;`), so C++'s integer promotions are narrowed back to
the torch dtype at each step and int8 arithmetic wraps as it does in eager. Values of float16/bfloat16
tensors are floats inside kernels; a cast to a narrow float rounds there and widens again.
"""
from __future__ import annotations

import struct

import torch

from ..kernel import KValue, widest_kind

_CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "float", torch.bfloat16: "float",
    torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}
_STORAGE = {**_CTYPES, torch.float16: "uint16_t", torch.bfloat16: "uint16_t"}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def ctype(dtype: torch.dtype) -> str:
    """The C++ type of a value of `dtype` inside a kernel."""
    try:
        return _CTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"ember's C++ backend has no type for {dtype}") from None


def storage_type(dtype: torch.dtype) -> str:
    """The C++ type of one element of a `dtype` buffer in memory."""
    try:
        return _STORAGE[dtype]
    except KeyError:
        raise NotImplementedError(f"ember's C++ backend has no type for {dtype}") from None


def load_expr(ptr_elem: str, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"ember::bf16_to_float({ptr_elem})"
    if dtype == torch.float16:
        return f"ember::half_to_float({ptr_elem})"
    return ptr_elem


def store_expr(value: str, value_dtype: torch.dtype, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"ember::float_to_bf16({value})"
    if dtype == torch.float16:
        return f"ember::float_to_half({value})"
    if dtype == torch.bool and value_dtype != torch.bool:
        return f"({value} != 0)"
    if value_dtype != dtype:
        return f"static_cast<{ctype(dtype)}>({value})"
    return value


def c_literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    cdt = compute_dtype(dtype)
    ct = ctype(cdt)
    if cdt.is_floating_point:
        v = float(value)
        if v != v:
            return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if v in (float("inf"), float("-inf")):
            return f"{'' if v > 0 else '-'}std::numeric_limits<{ct}>::infinity()"
        text = repr(v)
        if ct == "double":
            return text
        try:
            exact = struct.unpack("f", struct.pack("f", v))[0] == v
        except OverflowError:
            exact = False
        # torch rounds a Python scalar to the tensor's float type once, as static_cast does
        return f"{text}f" if exact else f"static_cast<float>({text})"
    v = int(value)
    if ct == "int32_t" and -2 ** 31 <= v < 2 ** 31:
        return str(v)
    if ct == "int64_t" and v == -2 ** 63:
        return "INT64_MIN"
    return f"static_cast<{ct}>({v}LL)"


# name -> format; {0} the operand, {t} its C++ type
_UNARY = {
    "neg": "(-{0})", "exp": "ember::exp_({0})", "exp2": "std::exp2({0})", "expm1": "std::expm1({0})",
    "log": "std::log({0})", "log2": "std::log2({0})", "log10": "std::log10({0})", "log1p": "std::log1p({0})",
    "sqrt": "std::sqrt({0})", "rsqrt": "(static_cast<{t}>(1) / std::sqrt({0}))", "sin": "std::sin({0})",
    "cos": "std::cos({0})", "tan": "std::tan({0})", "asin": "std::asin({0})", "acos": "std::acos({0})",
    "atan": "std::atan({0})", "sinh": "std::sinh({0})", "cosh": "std::cosh({0})", "tanh": "std::tanh({0})",
    "asinh": "std::asinh({0})", "acosh": "std::acosh({0})", "atanh": "std::atanh({0})", "erf": "ember::erf_({0})",
    "erfc": "std::erfc({0})", "erfinv": "ember::erfinv<{t}>({0})",
    "sigmoid": "(static_cast<{t}>(1) / (static_cast<{t}>(1) + ember::exp_(-{0})))",
    "floor": "std::floor({0})", "ceil": "std::ceil({0})", "trunc": "std::trunc({0})",
    "round": "std::nearbyint({0})", "reciprocal": "(static_cast<{t}>(1) / {0})", "square": "({0} * {0})",
    "lgamma": "std::lgamma({0})", "relu": "({0} < 0 ? static_cast<{t}>(0) : {0})",
}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLOAT_BINARY = {"pow": "std::pow", "atan2": "std::atan2", "hypot": "std::hypot", "copysign": "std::copysign"}


def _category(dtype) -> int:
    if dtype == torch.bool:
        return 0
    return 2 if dtype.is_floating_point else 1


def _is_int(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


def result_dtype(a: KValue, b: KValue) -> torch.dtype:
    """Dtype of a binary op's result: a constant operand acts like a Python scalar (it does not widen
    a tensor value of its category), two tensor values promote as torch does."""
    if a.dtype == b.dtype:
        return a.dtype
    if (a.kind == "const") != (b.kind == "const"):
        c, t = (a, b) if a.kind == "const" else (b, a)
        if _category(c.dtype) <= _category(t.dtype):
            return t.dtype
    return torch.promote_types(a.dtype, b.dtype)


class CppSpelling:
    """Mixin: needs `self.cse(expr, dtype, kind)`."""

    def _op(self, expr: str, dtype, *vals) -> KValue:
        kind = widest_kind(*vals)
        return self.cse(expr, dtype, "scalar" if kind == "const" else kind)

    def constant(self, value, dtype) -> KValue:
        # a narrow-float constant stays a float: eager applies Python scalars in float32 math too
        cdt = torch.bool if dtype == torch.bool else compute_dtype(dtype)
        return KValue(c_literal(value, cdt), cdt, "const")

    def to_dtype(self, x: KValue, dtype, src_dtype=None) -> KValue:
        if dtype == torch.bool:
            return x if x.dtype == torch.bool else self._op(f"({x} != 0)", torch.bool, x)
        cdt = compute_dtype(dtype)
        if dtype == torch.bfloat16:
            return self._op(f"ember::round_bf16(static_cast<float>({x}))", cdt, x)
        if dtype == torch.float16:
            return self._op(f"ember::round_half(static_cast<float>({x}))", cdt, x)
        if x.dtype == cdt:
            return x
        return self._op(f"static_cast<{ctype(cdt)}>({x})", cdt, x)

    def where(self, cond, a, b) -> KValue:
        dtype = result_dtype(a, b)
        t = ctype(dtype)
        return self._op(f"({cond} ? static_cast<{t}>({a}) : static_cast<{t}>({b}))", dtype, cond, a, b)

    def __getattr__(self, name):
        if name in _UNARY:
            fmt = _UNARY[name]
            return lambda x: self._op(fmt.format(x, t=ctype(x.dtype)), x.dtype, x)
        if name in _INFIX:
            sym = _INFIX[name]
            return lambda a, b: self._op(f"({a} {sym} {b})", result_dtype(a, b), a, b)
        if name in _COMPARE:
            sym = _COMPARE[name]
            return lambda a, b: self._op(f"({a} {sym} {b})", torch.bool, a, b)
        if name in _FLOAT_BINARY:
            fn = _FLOAT_BINARY[name]
            return lambda a, b: self._float_binary(fn, a, b)
        raise AttributeError(name)

    def rand(self, seed, offset):
        return self._op(f"ember::philox_rand({seed}, {offset})", torch.float32, seed, offset)

    def randn(self, seed, offset):
        return self._op(f"ember::philox_randn({seed}, {offset})", torch.float32, seed, offset)

    def randint64(self, seed, offset, low, high):
        return self._op(f"ember::philox_randint64({seed}, {offset}, {low}, {high})", torch.int64,
                        seed, offset, low, high)

    def _typed(self, fn: str, a, b):
        dt = result_dtype(a, b)
        t = ctype(dt)
        return self._op(f"{fn}<{t}>(static_cast<{t}>({a}), static_cast<{t}>({b}))", dt, a, b)

    def _float_binary(self, fn, a, b):
        dt = result_dtype(a, b)
        if not dt.is_floating_point:
            dt = torch.float32
        t = ctype(dt)
        return self._op(f"{fn}(static_cast<{t}>({a}), static_cast<{t}>({b}))", dt, a, b)

    def abs(self, x):
        if x.dtype == torch.bool:
            return x
        return self._op(f"static_cast<{ctype(x.dtype)}>(std::abs({x}))", x.dtype, x)

    def truediv(self, a, b):
        dt = result_dtype(a, b)
        if not dt.is_floating_point:
            dt = torch.float32
        t = ctype(dt)
        return self._op(f"(static_cast<{t}>({a}) / static_cast<{t}>({b}))", dt, a, b)

    def maximum(self, a, b):
        if result_dtype(a, b).is_floating_point:
            return self._typed("ember::max_nan", a, b)
        dt = result_dtype(a, b)
        return self._op(f"({a} > {b} ? static_cast<{ctype(dt)}>({a}) : static_cast<{ctype(dt)}>({b}))", dt, a, b)

    def minimum(self, a, b):
        if result_dtype(a, b).is_floating_point:
            return self._typed("ember::min_nan", a, b)
        dt = result_dtype(a, b)
        return self._op(f"({a} < {b} ? static_cast<{ctype(dt)}>({a}) : static_cast<{ctype(dt)}>({b}))", dt, a, b)

    def floordiv(self, a, b):
        return self._typed("ember::floordiv_int" if _is_int(result_dtype(a, b)) else "ember::floordiv_float", a, b)

    def remainder(self, a, b):
        return self._typed("ember::remainder_int" if _is_int(result_dtype(a, b)) else "ember::remainder_float", a, b)

    def fmod(self, a, b):
        if _is_int(result_dtype(a, b)):
            return self._typed("ember::fmod_int", a, b)
        return self._float_binary("std::fmod", a, b)

    def bitwise_left_shift(self, a, b):
        return self._typed("ember::shl", a, b)

    def bitwise_right_shift(self, a, b):
        return self._typed("ember::shr", a, b)

    def sign(self, x):
        if x.dtype == torch.bool:
            return x
        t = ctype(x.dtype)
        # NaN compares false both ways: sign(NaN) is 0, as in eager
        return self._op(f"static_cast<{t}>(({x} > 0) - ({x} < 0))", x.dtype, x)

    def signbit(self, x):
        if not x.dtype.is_floating_point:
            return self._op(f"({x} < 0)", torch.bool, x)
        return self._op(f"std::signbit({x})", torch.bool, x)

    def isnan(self, x):
        return self._op(f"({x} != {x})", torch.bool, x)

    def isinf(self, x):
        if not x.dtype.is_floating_point:
            return self.constant(False, torch.bool)
        return self._op(f"std::isinf({x})", torch.bool, x)

    def logical_not(self, x):
        return self._op(f"({x} == 0)", torch.bool, x)

    def bitwise_not(self, x):
        if x.dtype == torch.bool:
            return self.logical_not(x)
        return self._op(f"static_cast<{ctype(x.dtype)}>(~{x})", x.dtype, x)

    def _logical(self, sym, a, b):
        return self._op(f"(({a} != 0) {sym} ({b} != 0))", torch.bool, a, b)

    def logical_and(self, a, b):
        return self._logical("&&", a, b)

    def logical_or(self, a, b):
        return self._logical("||", a, b)

    def logical_xor(self, a, b):
        return self._logical("!=", a, b)
