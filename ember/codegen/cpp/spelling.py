"""C++ spellings of the math ops, as a mixin of the C++ kernel handler, and the expression builder the
reduction steps (codegen/reduction_steps.py) are rendered with. An op's result dtype and cost are the op
table's (ember/ir/op_table.py).

Every value is a typed local (`float tmp3 = ...;`), so C++'s integer promotions are narrowed back to
the torch dtype at each step and int8 arithmetic wraps as it does in eager. Values of float16/bfloat16
tensors are floats inside kernels; a cast to a narrow float rounds there and widens again.
"""
from __future__ import annotations

import struct

import torch

from ...ir.op_table import MATH_OPS, compute_dtype
from ..kernel import KValue, OpSpelling, op_dtype
from ..reduction_steps import ExprBuilder

_CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "float", torch.bfloat16: "float",
    torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}
_STORAGE = {**_CTYPES, torch.float16: "uint16_t", torch.bfloat16: "uint16_t"}


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


def _is_int(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


class CppSpelling(OpSpelling):
    """Mixin: needs `self._value(expr, dtype, kind, operands, costly)` (codegen.kernel.OpSpelling)."""
    logical_symbols = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}


    def constant(self, value, dtype) -> KValue:
        # a narrow-float constant stays a float: eager applies Python scalars in float32 math too
        cdt = MATH_OPS["constant"].result_dtype((), target=dtype)
        return KValue(c_literal(value, cdt), cdt, "const")

    def to_dtype(self, x: KValue, dtype, src_dtype=None) -> KValue:
        cdt = MATH_OPS["to_dtype"].result_dtype((x.dtype,), target=dtype)
        if cdt == torch.bool:
            return x if x.dtype == torch.bool else self._op("to_dtype", f"({x} != 0)", x, dtype=cdt)
        if dtype == torch.bfloat16:
            return self._op("to_dtype", f"ember::round_bf16(static_cast<float>({x}))", x, dtype=cdt)
        if dtype == torch.float16:
            return self._op("to_dtype", f"ember::round_half(static_cast<float>({x}))", x, dtype=cdt)
        if x.dtype == cdt:
            return x
        return self._op("to_dtype", f"static_cast<{ctype(cdt)}>({x})", x, dtype=cdt)

    def where(self, cond, a, b) -> KValue:
        t = ctype(op_dtype("where", cond, a, b))
        return self._op("where", f"({cond} ? static_cast<{t}>({a}) : static_cast<{t}>({b}))", cond, a, b)

    def __getattr__(self, name):
        if name in _UNARY:
            fmt = _UNARY[name]
            return lambda x: self._op(name, fmt.format(x, t=ctype(op_dtype(name, x))), x)
        if name in _INFIX:
            sym = _INFIX[name]
            return lambda a, b: self._op(name, f"({a} {sym} {b})", a, b)
        if name in _COMPARE:
            sym = _COMPARE[name]
            return lambda a, b: self._op(name, f"({a} {sym} {b})", a, b)
        if name in _FLOAT_BINARY:
            return lambda a, b: self._call(name, _FLOAT_BINARY[name], a, b)
        raise AttributeError(name)

    def rand(self, seed, offset):
        return self._op("rand", f"ember::philox_rand({seed}, {offset})", seed, offset, dtype=torch.float32)

    def randn(self, seed, offset):
        return self._op("randn", f"ember::philox_randn({seed}, {offset})", seed, offset, dtype=torch.float32)

    def randint64(self, seed, offset, low, high):
        return self._op("randint64", f"ember::philox_randint64({seed}, {offset}, {low}, {high})",
                        seed, offset, low, high, dtype=torch.int64)

    def keep_bits8(self, seed, offset, p):
        call = f"ember::philox_keep_bits8({seed}, {offset}, static_cast<float>({float(p)!r}))"
        return self._op("keep_bits8", call, seed, offset, dtype=torch.uint8)

    def _call(self, name, fn: str, a, b, template=False):
        """`fn(a, b)` with both operands as the result's type (`fn<T>(...)` with `template`)."""
        t = ctype(op_dtype(name, a, b))
        return self._op(name, f"{fn}{f'<{t}>' if template else ''}(static_cast<{t}>({a}), static_cast<{t}>({b}))", a, b)

    def abs(self, x):
        if x.dtype == torch.bool:
            return x
        return self._op("abs", f"static_cast<{ctype(x.dtype)}>(std::abs({x}))", x)

    def truediv(self, a, b):
        t = ctype(op_dtype("truediv", a, b))
        return self._op("truediv", f"(static_cast<{t}>({a}) / static_cast<{t}>({b}))", a, b)

    def maximum(self, a, b):
        return self._select("maximum", ">", "ember::max_nan", a, b)

    def minimum(self, a, b):
        return self._select("minimum", "<", "ember::min_nan", a, b)

    def _select(self, name, better: str, nan_fn: str, a, b):
        dt = op_dtype(name, a, b)
        if dt.is_floating_point:
            return self._call(name, nan_fn, a, b, template=True)
        t = ctype(dt)
        return self._op(name, f"({a} {better} {b} ? static_cast<{t}>({a}) : static_cast<{t}>({b}))", a, b)

    def floordiv(self, a, b):
        fn = "ember::floordiv_int" if _is_int(op_dtype("floordiv", a, b)) else "ember::floordiv_float"
        return self._call("floordiv", fn, a, b, template=True)

    def remainder(self, a, b):
        fn = "ember::remainder_int" if _is_int(op_dtype("remainder", a, b)) else "ember::remainder_float"
        return self._call("remainder", fn, a, b, template=True)

    def fmod(self, a, b):
        if _is_int(op_dtype("fmod", a, b)):
            return self._call("fmod", "ember::fmod_int", a, b, template=True)
        return self._call("fmod", "std::fmod", a, b)

    def bitwise_left_shift(self, a, b):
        return self._call("bitwise_left_shift", "ember::shl", a, b, template=True)

    def bitwise_right_shift(self, a, b):
        return self._call("bitwise_right_shift", "ember::shr", a, b, template=True)

    def sign(self, x):
        if x.dtype == torch.bool:
            return x
        # NaN compares false both ways: sign(NaN) is 0, as in eager
        return self._op("sign", f"static_cast<{ctype(x.dtype)}>(({x} > 0) - ({x} < 0))", x)

    def signbit(self, x):
        if not x.dtype.is_floating_point:
            return self._op("signbit", f"({x} < 0)", x)
        # not std::signbit: on a float bit-cast from a half (ember::half_to_float) in a SIMD loop, GCC 12
        # stops with an internal compiler error; copysign moves the sign bit, a NaN's included
        return self._op("signbit", f"(std::copysign(static_cast<{ctype(x.dtype)}>(1), {x}) < 0)", x)

    def isinf(self, x):
        if not x.dtype.is_floating_point:
            return self.constant(False, torch.bool)
        return self._op("isinf", f"std::isinf({x})", x)

    def bitwise_not(self, x):
        if x.dtype == torch.bool:
            return self.logical_not(x)
        return self._op("bitwise_not", f"static_cast<{ctype(x.dtype)}>(~{x})", x)



class CppExprs(ExprBuilder):
    """The expression builder of codegen/reduction_steps.py in C++, over values of `dtype`. Its ops are
    generic (no casts, no templates with a type), so a combine spelled by it also runs on GCC vector types
    (ember::reduce_lanes)."""
    infix = {**_INFIX, **_COMPARE}
    statement = "const auto {name} = {expr};"

    def __init__(self, dtype, prefix: str = ""):
        super().__init__(prefix)
        self.dtype = dtype

    def constant(self, value) -> str:
        return c_literal(value, self.dtype)

    def truediv(self, a, b):
        return f"({a} / {b})"

    def neg(self, x):
        return f"(-{x})"

    def abs(self, x):
        return f"std::abs({x})"

    def exp(self, x):
        return f"std::exp({x})"          # libm's (libmvec's in SIMD loops)

    def maximum(self, a, b):
        return f"ember::max_nan({a}, {b})" if self.dtype.is_floating_point else f"({a} > {b} ? {a} : {b})"

    def minimum(self, a, b):
        return f"ember::min_nan({a}, {b})" if self.dtype.is_floating_point else f"({a} < {b} ? {a} : {b})"

    def logical_or(self, a, b):
        return f"({a} || {b})"

    def logical_and(self, a, b):
        return f"({a} && {b})"

    def where(self, c, a, b):
        return f"({c} ? {a} : {b})"
