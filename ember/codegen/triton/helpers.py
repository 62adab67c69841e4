"""@triton.jit helpers that generated kernels call as `helpers.<name>` (combine functions for
tl.reduce and tl.associative_scan, and integer arithmetic with Python's rounding)."""
import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":      # the interpreter does not patch libdevice
    from ember.codegen.triton import interp_libdevice as libdevice
else:
    from triton.language.extra import libdevice


@triton.jit
def max_nan(a, b):
    # NaN wins, as in torch.amax
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def min_nan(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def max_int(a, b):
    return tl.maximum(a, b)


@triton.jit
def min_int(a, b):
    return tl.minimum(a, b)


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def prod(a, b):
    return a * b


@triton.jit
def logaddexp(a, b):
    # max + log1p(exp(min - max)): never overflows. Equal values give max + log(2), so equal infinities
    # give that infinity (min - max would be nan); a NaN operand propagates.
    pick_a = (a > b) | (a != a)
    mx = tl.where(pick_a, a, b)
    mn = tl.where(pick_a, b, a)
    same = mx == mn
    return mx + libdevice.log1p(tl.exp(tl.where(same, 0.0, mn) - tl.where(same, 0.0, mx)))


@triton.jit
def logical_or(a, b):
    return a | b


@triton.jit
def logical_and(a, b):
    return a & b


@triton.jit
def argmax_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    tie = (a == b) | (a_nan & b_nan)
    pick_a = (a > b) | (a_nan & ~b_nan) | (tie & (ai < bi))
    return tl.where(pick_a, a, b), tl.where(pick_a, ai, bi)


@triton.jit
def argmin_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    tie = (a == b) | (a_nan & b_nan)
    pick_a = (a < b) | (a_nan & ~b_nan) | (tie & (ai < bi))
    return tl.where(pick_a, a, b), tl.where(pick_a, ai, bi)


@triton.jit
def welford_combine(mean_a, m2_a, w_a, mean_b, m2_b, w_b):
    delta = mean_b - mean_a
    w = w_a + w_b
    frac = tl.where(w == 0.0, 0.0, w_b / tl.where(w == 0.0, 1.0, w))
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * w_a * frac, w


@triton.jit
def softmax_stats_combine(m_a, s_a, m_b, s_b):
    # (max, sum of exp(v - max)) of two parts: each sum rescaled to the common max. An empty part (sum
    # 0: no element, or only -inf ones) adds nothing, also where both maxima are -inf (exp(nan))
    m = max_nan(m_a, m_b)
    e_a = tl.where(s_a == 0.0, 0.0, s_a * tl.exp(m_a - m))
    e_b = tl.where(s_b == 0.0, 0.0, s_b * tl.exp(m_b - m))
    return m, e_a + e_b


@triton.jit
def floordiv_int(a, b):
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) != (b < 0))
    return tl.where(fix, q - 1, q)


@triton.jit
def remainder_int(a, b):
    r = a % b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)


@triton.jit
def remainder_float(a, b, r):
    # r is fmod(a, b), computed by the caller (libdevice is backend-specific)
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)


@triton.jit
def randint64(seed, offset, low, high):
    # two Philox words as one uint64, reduced into [low, high) (as ember::philox_randint64 in C++)
    r0, r1, _, _ = tl.randint4x(seed, offset)
    r = r0.to(tl.uint64) | (r1.to(tl.uint64) << 32)
    return low + (r % (high - low).to(tl.uint64)).to(tl.int64)
