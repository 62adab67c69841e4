"""The ops protocol that define-by-run `inner_fn`s call: `ops.load(name, index)`, `ops.add(a, b)` ...

`ops.<name>(...)` dispatches to the handler bound in `ember.state.ops_handler`. A handler is any object
with these methods; what a "value" is belongs to the handler (a string of code, a recorded node, a
number). The full list of names a handler may be asked for is OP_NAMES; `ember.codegen` handlers must
implement all of them (a test checks this).

Memory:     load(name, index) · store(name, index, value, mode=None) · store_reduction(name, index, value)
            index_expr(expr, dtype) · indirect_indexing(value, size) -> sympy symbol
            A store's mode is one of STORE_MODES: None writes the value (where several elements of a
            kernel write one position, as scatters with repeated indices do, any one of them wins,
            as in eager); "atomic_add" adds it to what is there, atomically across threads, for
            buffers of float32, float64, int32 or int64 (narrower types accumulate in a wider buffer).
Constants:  constant(value, dtype)
Casts:      to_dtype(x, dtype, src_dtype)
Control:    where(cond, a, b)
Random:     rand(seed, offset) -> float32 in [0, 1) · randn(seed, offset) -> float32 N(0, 1) ·
            randint64(seed, offset, low, high) -> int64 in [low, high) · keep_bits8(seed, offset, p)
            -> uint8 whose bit j is 1 where the j-th of eight uniforms is >= p (the four words of the
            Philox draws at 2 * offset and 2 * offset + 1: eight dropout keep flags for two draws, where
            rand takes one per flag): pure functions of an int64 seed and an integer offset
            (Philox4x32-10, Triton's tl.rand convention), so recomputing an element anywhere gives the
            same number
Reduction:  reduction(dtype, src_dtype, reduction_type, value) -> value (a tuple: TUPLE_REDUCTIONS)
Scan:       scan(dtype, combine, value) -> value combined with every earlier step along the kernel's
            r axis (a scan's steps), combine one of SCAN_COMBINES; dtype is the result's
Math:       the names in UNARY, BINARY below.

What each op means beyond its arguments -- a math op's result dtype and cost, a reduction's identity and
combine, a scan's identity -- is ember/ir/op_table.py's (MATH_OPS, REDUCTIONS, SCANS).
"""
from __future__ import annotations

from .. import state

UNARY = (
    "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
    "asinh acosh atanh erf erfc erfinv sigmoid floor ceil trunc round sign signbit reciprocal square "
    "logical_not bitwise_not isnan isinf lgamma relu"
).split()
BINARY = (
    "add sub mul truediv floordiv remainder fmod pow maximum minimum atan2 hypot copysign "
    "eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
    "bitwise_left_shift bitwise_right_shift"
).split()
MEMORY = "load store store_reduction index_expr indirect_indexing constant to_dtype where reduction scan".split()
RANDOM = "rand randn randint64 keep_bits8".split()
OP_NAMES = tuple(UNARY + BINARY + MEMORY + RANDOM)

STORE_MODES = (None, "atomic_add")
REDUCTION_TYPES = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin", "welford", "online_softmax")
# reductions whose value is a tuple: welford (mean, m2, weight); online_softmax (max, sum of exp(v - max))
TUPLE_REDUCTIONS = {"welford": 3, "online_softmax": 2}
SCAN_COMBINES = ("add", "mul", "logaddexp")


class _Ops:
    """`ops.add(a, b)` -> state.ops_handler.get().add(a, b)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def dispatch(*args, **kwargs):
            h = state.ops_handler.get()
            if h is None:
                raise RuntimeError(f"ops.{name} called with no ops handler bound (use ember.ir.ops.handler(...))")
            return getattr(h, name)(*args, **kwargs)
        dispatch.__name__ = name
        return dispatch


ops = _Ops()


def handler(h):
    """Context manager binding `h` as the current ops handler."""
    return state.bind(state.ops_handler, h)


class DefaultHandler:
    """Base for handlers: every op not defined goes to `_default(name, args)`."""

    def _default(self, name, args, kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no op {name}")

    def __getattr__(self, name):
        if name in OP_NAMES:
            return lambda *args, **kwargs: self._default(name, args, kwargs)
        raise AttributeError(name)
