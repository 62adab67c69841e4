"""What each IR op means, whatever the kernel language: the one place that decides an op's result dtype,
its cost, and a reduction's or scan's identity and combine. Kernel backends (ember/codegen/) only spell
the ops; they ask this table everything else.

Math ops (`MATH_OPS`, one `MathOp` per name of ops.UNARY and ops.BINARY, plus where, to_dtype and
constant): arity, result-dtype rule, cost class.

  Result rules. Operands arrive promoted by the lowering (ember/lowering/pointwise.py), so within a
  kernel the rules mostly keep a dtype; they also decide the odd mixes that lowerings build by hand.
    SAME     the operand's dtype (unary ops whose eager result keeps an integer or bool dtype)
    PROMOTE  torch's promotion of the operands, where a literal constant acts like a Python scalar: it
             widens the result only when its category (bool < integer < float) is higher, as eager's
             `int8_tensor + 1` stays int8 and `int_tensor * 0.5` becomes float
    FLOAT    PROMOTE, then an integer or bool result becomes float32 (truediv, pow, exp, sqrt ...)
    BOOL     bool (comparisons, logical ops, isnan ...)
    CAST     the compute dtype of the requested one (to_dtype, constant): values of float16/bfloat16
             tensors are float32 inside kernels (`compute_dtype`)

  Cost classes. TRANSCENDENTAL ops call a libm-class function (exp, log, trig, erf, lgamma, pow, fmod)
  on floats: a GPU kernel computing one on 16-bit floats is bound by arithmetic as much as by memory
  (codegen/triton/heuristics.py), and the C++ kernel keeps such a value, and every value computed from
  one, in a row buffer rather than computing it again in a later loop over the row. On integers every
  op is CHEAP.

Reductions (`REDUCTIONS`, one per ops.REDUCTION_TYPES): the IR op that merges two partial results where
one does (sum -> add, max -> maximum, any -> logical_or ...), how many values the result has
(ops.TUPLE_REDUCTIONS), the result's dtype, and the identity the accumulators start from, as a Python
value of the accumulator's dtype. Welford's and softmax statistics' steps are in
ember/codegen/reduction_steps.py. Scans (`SCANS`, one per ops.SCAN_COMBINES): the identity.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch

from .ops import BINARY, REDUCTION_TYPES, SCAN_COMBINES, TUPLE_REDUCTIONS, UNARY

SAME, PROMOTE, FLOAT, BOOL, CAST = "same", "promote", "float", "bool", "cast"
CHEAP, TRANSCENDENTAL = "cheap", "transcendental"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype values of a `dtype` tensor have inside kernels: float16 and bfloat16 compute in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    return 2 if dtype.is_floating_point else 1


def promote(dtypes: Sequence[torch.dtype], scalars: Sequence[bool] = ()) -> torch.dtype:
    """torch's promotion of operand dtypes; `scalars[i]` marks operand i as a literal constant, which acts
    like a Python scalar: it widens the result only to a higher category (bool < integer < float)."""
    scalars = list(scalars) + [False] * (len(dtypes) - len(scalars))
    tensors = [d for d, s in zip(dtypes, scalars) if not s]
    consts = [d for d, s in zip(dtypes, scalars) if s]
    out = tensors[0] if tensors else consts[0]
    for d in tensors[1:]:
        out = torch.promote_types(out, d)
    for d in consts:
        if not tensors or _category(d) > _category(out):
            out = torch.promote_types(out, d)
    return out


@dataclasses.dataclass(frozen=True)
class MathOp:
    name: str
    arity: int
    result: str                         # SAME, PROMOTE, FLOAT, BOOL or CAST
    cost: str = CHEAP                   # CHEAP or TRANSCENDENTAL
    promoted: Optional[tuple] = None    # operand positions that promote (None: all); where's condition does not

    def result_dtype(self, dtypes: Sequence[torch.dtype], scalars: Sequence[bool] = (),
                     target: Optional[torch.dtype] = None) -> torch.dtype:
        """The result's dtype for operands of `dtypes` (`scalars` marks literal constants); `target` is the
        requested dtype of a CAST op."""
        if self.result == BOOL:
            return torch.bool
        if self.result == CAST:
            return target if target == torch.bool else compute_dtype(target)
        if self.promoted is not None:
            dtypes = [dtypes[i] for i in self.promoted]
            scalars = [scalars[i] for i in self.promoted if i < len(scalars)]
        if self.result == SAME:
            return dtypes[0]
        out = promote(dtypes, scalars)
        if self.result == FLOAT and not out.is_floating_point:
            return torch.float32
        return out

    def is_costly(self, result_dtype: torch.dtype) -> bool:
        """Whether computing this op's value of `result_dtype` costs a libm-class call."""
        return self.cost == TRANSCENDENTAL and result_dtype.is_floating_point


def _ops(names: str, arity: int, result: str, cost: str = CHEAP) -> dict:
    return {n: MathOp(n, arity, result, cost) for n in names.split()}


MATH_OPS: dict[str, MathOp] = {
    **_ops("neg abs sign square relu floor ceil trunc round bitwise_not", 1, SAME),
    **_ops("sqrt rsqrt reciprocal", 1, FLOAT),
    **_ops("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh "
           "erf erfc erfinv sigmoid lgamma", 1, FLOAT, TRANSCENDENTAL),
    **_ops("isnan isinf signbit logical_not", 1, BOOL),
    **_ops("add sub mul maximum minimum bitwise_and bitwise_or bitwise_xor bitwise_left_shift "
           "bitwise_right_shift", 2, PROMOTE),
    # on floats, Python's floor division and remainder are computed from fmod
    **_ops("floordiv remainder fmod", 2, PROMOTE, TRANSCENDENTAL),
    **_ops("truediv copysign", 2, FLOAT),
    **_ops("pow atan2 hypot", 2, FLOAT, TRANSCENDENTAL),
    **_ops("eq ne lt le gt ge logical_and logical_or logical_xor", 2, BOOL),
    "where": MathOp("where", 3, PROMOTE, promoted=(1, 2)),
    "to_dtype": MathOp("to_dtype", 1, CAST),
    "constant": MathOp("constant", 0, CAST),
}
assert set(UNARY) | set(BINARY) <= set(MATH_OPS), "every unary and binary IR op has an entry"


def lowest(dtype: torch.dtype):
    """The least value of `dtype` (max's identity): -inf, iinfo.min, False."""
    if dtype == torch.bool:
        return False
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def highest(dtype: torch.dtype):
    if dtype == torch.bool:
        return True
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


def typed(value, dtype: torch.dtype):
    """A Python number as a value of `dtype`: bool, int or float."""
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


@dataclasses.dataclass(frozen=True)
class Reduction:
    name: str
    combine: Optional[str]          # the IR op merging two partial results, where one op does
    arity: int                      # values in the result
    result: Optional[torch.dtype]   # the result's dtype, None: the reduction's own `dtype`
    # accumulator dtype -> the value(s) the accumulators start from, which merging leaves unchanged
    # (argmax/argmin: (value, index); welford: (mean, m2, weight); online_softmax: (max, sum))
    identity: Callable

    def result_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.result or dtype

    def accumulator_dtype(self, dtype: torch.dtype, src_dtype: torch.dtype) -> torch.dtype:
        """The dtype a reduction of `src_dtype` values to `dtype` accumulates in: a sum or product in the
        result's dtype, max/min/argmax/argmin in the values' own (exactly), any/all as bool."""
        if self.name in ("any", "all"):
            return torch.bool
        return dtype if self.name in ("sum", "prod", "welford", "online_softmax") else src_dtype


REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", "add", 1, None, lambda dt: typed(0, dt)),
    Reduction("prod", "mul", 1, None, lambda dt: typed(1, dt)),
    Reduction("max", "maximum", 1, None, lowest),
    Reduction("min", "minimum", 1, None, highest),
    Reduction("any", "logical_or", 1, torch.bool, lambda dt: False),
    Reduction("all", "logical_and", 1, torch.bool, lambda dt: True),
    # (value, index): an element equal to the start value takes its place only through the tie rule
    # (the first index wins), so a row of only -inf (or iinfo.min) gives index 0, as eager does
    Reduction("argmax", None, 1, torch.int64, lambda dt: (lowest(dt), 0)),
    Reduction("argmin", None, 1, torch.int64, lambda dt: (highest(dt), 0)),
    Reduction("welford", None, TUPLE_REDUCTIONS["welford"], None, lambda dt: (0.0, 0.0, 0.0)),
    Reduction("online_softmax", None, TUPLE_REDUCTIONS["online_softmax"], None,
              lambda dt: (float("-inf"), 0.0)),
)}
assert tuple(REDUCTIONS) == REDUCTION_TYPES


@dataclasses.dataclass(frozen=True)
class Scan:
    name: str
    start: float            # the identity of the combine

    def identity(self, dtype: torch.dtype):
        return typed(self.start, dtype)


SCANS: dict[str, Scan] = {s.name: s for s in (Scan("add", 0), Scan("mul", 1), Scan("logaddexp", float("-inf")))}
assert tuple(SCANS) == SCAN_COMBINES


def one_element_reduction(o, rtype: str, value, dtype: torch.dtype):
    """The result of reducing a row of one element `value` (of a compute dtype) to `dtype`, built with the
    ops handler `o`: the element itself (bool for any/all), index 0 for argmax/argmin, for welford (v, 0,
    1) and for online_softmax (v, 1), where an inf or nan element makes the 0 and the 1 nan, as eager's
    (v - v)^2 and exp(v - v) do."""
    if rtype in ("argmax", "argmin"):
        return o.constant(0, torch.int64)
    if rtype in ("any", "all"):
        return o.to_dtype(value, torch.bool)
    v = o.to_dtype(value, dtype)
    if rtype == "welford":
        d = o.sub(v, v)
        return v, o.mul(d, d), o.constant(1, dtype)
    if rtype == "online_softmax":
        return v, o.exp(o.sub(v, v))
    return v
