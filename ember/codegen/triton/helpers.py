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
def maximum_nan(a, b):
    # NaN wins, in one instruction on the GPU (max.NaN): for floats only
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


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
def erf_f32(x):
    # erf of a float32 within ~2 ulp (1.2e-7 absolute), without branches: x * P(x^2) below 0.921875,
    # else sign(x) * (1 - exp(Q(|x|))), Q fitted to log(erfc) on [0.921875, 3.92] (erf is 1 in float32
    # beyond). The coefficients are the C++ backend's erf_fast (codegen/cpp/prelude.py). Both halves are
    # computed and one is selected: on a GPU that beats libdevice's branches (a warp takes both anyway)
    a = tl.abs(x)
    t = x * x
    p = -5.98558050e-04
    p = p * t + 4.99210926e-03
    p = p * t + -2.67658588e-02
    p = p * t + 1.12817943e-01
    p = p * t + -3.76124918e-01
    p = p * t + 1.12837911
    u = tl.where(a > 3.92, 3.92, a) - 0.921875        # NaN stays NaN (tl.minimum would drop it)
    q = 1.94862470e-04
    q = q * u + -1.95510266e-03
    q = q * u + 1.06911166e-02
    q = q * u + -4.47586179e-02
    q = q * u + -8.33000958e-01
    q = q * u + -2.50801182
    q = q * u + -1.64856195
    e = tl.exp2(q * 1.4426950408889634)
    return tl.where(a < 0.921875, x * p, tl.where(x < 0, e - 1.0, 1.0 - e))


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
def _keep_bits4(seed, offset, p, shift: tl.constexpr):
    # the four words of one Philox draw as four keep flags (uniform >= p), at bits shift .. shift + 3
    w0, w1, w2, w3 = tl.randint4x(seed, offset)
    b = (tl.uint_to_uniform_float(w0) >= p).to(tl.uint8)
    b = b | ((tl.uint_to_uniform_float(w1) >= p).to(tl.uint8) << 1)
    b = b | ((tl.uint_to_uniform_float(w2) >= p).to(tl.uint8) << 2)
    b = b | ((tl.uint_to_uniform_float(w3) >= p).to(tl.uint8) << 3)
    return b << shift


@triton.jit
def keep_bits8(seed, offset, p):
    # eight dropout keep flags from two Philox draws (as ember::philox_keep_bits8 in C++). offset is int32
    # and below 2**30 (lowering/random.py): an int64 counter would switch Triton to its 64-bit Philox, other
    # numbers than C++'s and slower
    o = offset * 2
    return _keep_bits4(seed, o, p, 0) | _keep_bits4(seed, o + 1, p, 4)


@triton.jit
def randint64(seed, offset, low, high):
    # two Philox words as one uint64, reduced into [low, high) (as ember::philox_randint64 in C++)
    r0, r1, _, _ = tl.randint4x(seed, offset)
    r = r0.to(tl.uint64) | (r1.to(tl.uint64) << 32)
    return low + (r % (high - low).to(tl.uint64)).to(tl.int64)
