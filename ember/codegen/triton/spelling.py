"""Triton spellings of the math ops, as a mixin of the Triton kernel handler, and the expression builder
the reduction steps (codegen/reduction_steps.py) are rendered with. An op's result dtype and cost are the
op table's (ember/ir/op_table.py).

Values of float16/bfloat16 tensors are float32 inside kernels; a cast to a narrow float rounds and
widens again, so later math stays in float32 exactly as the rounded eager value would.
"""
from __future__ import annotations

import torch

from ...ir.op_table import MATH_OPS
from ..kernel import KValue, OpSpelling, literal, op_dtype
from ..reduction_steps import ExprBuilder

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


def module_header(interpreted: bool) -> str:
    """The imports a module of generated kernels starts with (the interpreter's libdevice is ember's)."""
    libdevice = "from ember.codegen.triton import interp_libdevice as libdevice" if interpreted else \
        "from triton.language.extra import libdevice"
    return f"import triton\nimport triton.language as tl\n{libdevice}\n\n\n"


# name -> format; {0} is the operand
UNARY = {
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
_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
          "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LIBDEVICE_BINARY = {"pow": "pow", "atan2": "atan2", "hypot": "hypot", "copysign": "copysign", "fmod": "fmod"}
# the @triton.jit functions that compute an IR op for tl.reduce and elementwise: (for floats, for integers
# and bool); max_nan and min_nan let a NaN win, as eager's maximum and amax do
_COMBINE_FNS = {"add": ("helpers.add",) * 2, "mul": ("helpers.prod",) * 2,
                "maximum": ("helpers.max_nan", "helpers.max_int"), "minimum": ("helpers.min_nan", "helpers.min_int"),
                "logical_or": ("helpers.logical_or",) * 2, "logical_and": ("helpers.logical_and",) * 2}


def combine_fn(op: str, dtype) -> str:
    """The @triton.jit function computing IR op `op` on values of `dtype` (tl.reduce's combine_fn)."""
    return _COMBINE_FNS[op][0 if dtype.is_floating_point else 1]


def _is_int(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


class TritonSpelling(OpSpelling):
    """Mixin: needs `self._value(expr, dtype, kind, operands, costly)` (codegen.kernel.OpSpelling)."""
    logical_symbols = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}


    # set once the kernel computes an op the op table calls transcendental: its launch config then gives
    # each thread more elements (heuristics.launch_config)
    math_heavy = False

    def constant(self, value, dtype) -> KValue:
        cdt = MATH_OPS["constant"].result_dtype((), target=dtype)
        if cdt == torch.bool:
            return KValue(f"tl.full([], {bool(value)!r}, tl.int1)", torch.bool, "const")
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
        cdt = MATH_OPS["to_dtype"].result_dtype((x.dtype,), target=dtype)
        if cdt == torch.bool:
            return self._op("to_dtype", f"({x} != 0)", x, dtype=cdt)
        if x.dtype == cdt and cdt == dtype:
            return x
        if dtype != cdt:  # narrow float: round there, compute on in float32
            return self._op("to_dtype", f"{_cast(x, dtype)}.to(tl.float32)", x, dtype=cdt)
        return self._op("to_dtype", _cast(x, cdt), x, dtype=cdt)

    def where(self, cond, a, b) -> KValue:
        return self._op("where", f"tl.where({cond}, {a}, {b})", cond, a, b)

    def erf(self, x: KValue) -> KValue:
        # float32: a branchless polynomial (helpers.erf_f32); libdevice's erff makes add+GELU slower
        # (docs/performance.md, "add+GELU is bound by erf's arithmetic")
        fn = "helpers.erf_f32" if x.dtype == torch.float32 else "libdevice.erf"
        return self._op("erf", f"{fn}({x})", x)

    def __getattr__(self, name):
        if name in UNARY:
            fmt = UNARY[name]
            return lambda x: self._op(name, fmt.format(x), x)
        if name in _INFIX:
            sym = _INFIX[name]
            return lambda a, b: self._op(name, f"({a} {sym} {b})", a, b)
        if name in _COMPARE:
            sym = _COMPARE[name]
            return lambda a, b: self._op(name, f"({a} {sym} {b})", a, b)
        if name in _LIBDEVICE_BINARY:
            return lambda a, b: self._binary_math(name, a, b)
        raise AttributeError(name)

    def rand(self, seed, offset):
        return self._op("rand", f"tl.rand({seed}, {_as_tensor(offset)})", seed, offset, dtype=torch.float32)

    def randn(self, seed, offset):
        return self._op("randn", f"tl.randn({seed}, {_as_tensor(offset)})", seed, offset, dtype=torch.float32)

    def randint64(self, seed, offset, low, high):
        return self._op("randint64", f"helpers.randint64({seed}, {_as_tensor(offset)}, {_as_tensor(low)}, "
                        f"{_as_tensor(high)})", seed, offset, low, high, dtype=torch.int64)

    def keep_bits8(self, seed, offset, p):
        return self._op("keep_bits8", f"helpers.keep_bits8({seed}, {_as_tensor(offset)}, {float(p)!r})", seed, offset,
                        dtype=torch.uint8)

    def _binary_math(self, name, a, b):
        if name == "fmod" and _is_int(op_dtype(name, a, b)):
            return self._op(name, f"({a} % {b})", a, b)
        return self._op(name, f"libdevice.{_LIBDEVICE_BINARY[name]}({_as_tensor(a)}, {_as_tensor(b)})", a, b)

    def maximum(self, a, b):
        return self._op("maximum", f"{combine_fn('maximum', op_dtype('maximum', a, b))}({a}, {b})", a, b)

    def minimum(self, a, b):
        return self._op("minimum", f"{combine_fn('minimum', op_dtype('minimum', a, b))}({a}, {b})", a, b)

    def floordiv(self, a, b):
        if _is_int(op_dtype("floordiv", a, b)):
            return self._op("floordiv", f"helpers.floordiv_int({a}, {b})", a, b)
        return self._op("floordiv", f"libdevice.floor({a} / {b})", a, b)

    def remainder(self, a, b):
        if _is_int(op_dtype("remainder", a, b)):
            return self._op("remainder", f"helpers.remainder_int({a}, {b})", a, b)
        r = self._binary_math("fmod", a, b)
        return self._op("remainder", f"helpers.remainder_float({a}, {b}, {r})", a, b, r)

    def sign(self, x):
        if x.dtype == torch.bool:
            return x
        t = triton_type(x.dtype)
        return self._op("sign", f"(({x} > 0).to({t}) - ({x} < 0).to({t}))", x)

    def signbit(self, x):
        if not x.dtype.is_floating_point:
            return self._op("signbit", f"({x} < 0)", x)
        return self._op("signbit", f"(libdevice.signbit({x}) != 0)", x)

    def isinf(self, x):
        return self._op("isinf", f"(tl.abs({x}) == float(\"inf\"))", x)

    def bitwise_not(self, x):
        return self._op("bitwise_not", f"(~{x})", x)



class TritonExprs(ExprBuilder):
    """The expression builder of codegen/reduction_steps.py in Triton."""
    infix = {**_INFIX, **_COMPARE}

    def constant(self, value) -> str:
        return literal(value)

    def neg(self, x):
        return f"(-{x})"

    def abs(self, x):
        return f"tl.abs({x})"

    def exp(self, x):
        return f"tl.exp({x})"

    def maximum(self, a, b):
        return f"helpers.maximum_nan({a}, {b})"     # floats only: NaN wins in one instruction on a GPU

    def logical_or(self, a, b):
        return f"({a} | {b})"

    def where(self, c, a, b):
        return f"tl.where({c}, {a}, {b})"


def _cast(x: KValue, dtype) -> str:
    if x.kind == "const" and not x.name.startswith("tl."):
        return f"tl.full([], {x.name}, {triton_type(x.dtype)}).to({triton_type(dtype)})"
    return f"{x.name}.to({triton_type(dtype)})"


def _as_tensor(v: KValue) -> str:
    # libdevice wants tensors; a float literal becomes a 0-d float32 tensor
    if v.kind == "const" and not v.name.startswith("tl."):
        return f"tl.full([], {v.name}, {triton_type(v.dtype)})"
    return v.name
