"""Binary elementwise lowerings (arithmetic, division modes, pow, maximum/minimum, comparisons, logical and
bitwise ops) against eager, on fresh random inputs.

`lowered(...)` (ember.testing) also asserts that no ATen fallback ran: the op really went through ember's lowering.
"""
import pytest
import torch

from ember.testing import check, interpreter_xfail, lowered, randb, randf, randi

aten = torch.ops.aten
F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64, I8, U8, BOOL = torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool


# --- binary arithmetic ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I32, I64])
@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul], ids=lambda f: f.__name__)
def test_add_sub_mul(device, op, dtype):
    mk = (lambda *s: randf(*s, dtype=dtype, device=device)) if dtype.is_floating_point else \
        (lambda *s: randi(*s, dtype=dtype, device=device))
    lowered(lambda a, b: (op(a, b), op(a, 3), op(a, b[0])), mk(6, 10), mk(10))


@pytest.mark.parametrize("alpha", [2, -3, 0])
def test_add_sub_alpha_int(device, alpha):
    a, b = randi(5, 7, device=device), randi(5, 7, device=device)
    lowered(lambda x, y: (torch.add(x, y, alpha=alpha), torch.sub(x, y, alpha=alpha),
                          torch.add(x, 5, alpha=alpha), torch.sub(x, 5, alpha=alpha)), a, b)


@pytest.mark.parametrize("alpha", [0.5, -2.25, 3])
def test_add_sub_alpha_float(device, alpha):
    a, b = randf(5, 7, device=device), randf(7, device=device)
    lowered(lambda x, y: (torch.add(x, y, alpha=alpha), torch.sub(x, y, alpha=alpha),
                          torch.add(x, 1.5, alpha=alpha), torch.sub(x, 1.5, alpha=alpha)), a, b)


def test_add_sub_alpha_grad(device):
    a, b = randf(5, 7, device=device), randf(5, 7, device=device)
    lowered(lambda x, y: torch.add(x, y, alpha=0.5) * torch.sub(x, y, alpha=2), a, b, grad=True)


@pytest.mark.parametrize("dtype", [F32, I64, I32])
@pytest.mark.parametrize("alpha", [1, 2, -3])
def test_rsub(device, dtype, alpha):
    mk = (lambda *s: randf(*s, dtype=dtype, device=device)) if dtype.is_floating_point else \
        (lambda *s: randi(*s, dtype=dtype, device=device))
    a, b = mk(4, 6), mk(4, 6)
    lowered(lambda x, y: (torch.rsub(x, y, alpha=alpha), torch.rsub(x, 7, alpha=alpha)), a, b)


def test_rsub_float_alpha_and_python_rsub(device):
    a, b = randf(4, 6, device=device), randf(4, 6, device=device)
    lowered(lambda x, y: (torch.rsub(x, y, alpha=0.25), torch.rsub(x, 2.5, alpha=1.5), 1 - x, 2.5 - y), a, b)


def test_rsub_int_tensor_float_scalar(device):
    a = randi(4, 6, device=device)
    lowered(lambda x: (1.5 - x, torch.rsub(x, 2.5)), a)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_true_div(device, dtype):
    a, b = randf(6, 9, dtype=dtype, device=device), randf(6, 9, lo=0.5, hi=3, dtype=dtype, device=device)
    lowered(lambda x, y: (x / y, x / 3.0, 2.0 / y, torch.true_divide(x, y)), a, b)


def test_integer_true_division(device):
    a, b = randi(6, 9, device=device), randi(6, 9, device=device, nonzero=True)
    lowered(lambda x, y: (x / y, x / 4, torch.div(x, y), torch.true_divide(x, 3), x.to(torch.int32) / y), a, b)


def test_division_by_zero_float(device):
    a = torch.tensor([1.0, -1.0, 0.0, 2.0], device=device)
    b = torch.tensor([0.0, 0.0, 0.0, -0.0], device=device)
    lowered(lambda x, y: (x / y, torch.div(x, y, rounding_mode="floor"), torch.div(x, y, rounding_mode="trunc"),
                          torch.remainder(x, y), torch.fmod(x, y)), a, b)


# bfloat16 trunc: see test_div_trunc_bf16_rounds_the_quotient_first
@pytest.mark.parametrize("mode,dtype", [(m, d) for m in ("floor", "trunc", None) for d in (F32, F64, F16, BF16)
                                        if (m, d) != ("trunc", BF16)], ids=str)
def test_div_rounding_mode_float(device, mode, dtype):
    a = randf(7, 11, lo=-20, hi=20, dtype=dtype, device=device)
    b = randf(7, 11, lo=0.3, hi=4, dtype=dtype, device=device) * torch.where(torch.rand(7, 11, device=device) > 0.5, 1, -1).to(dtype)
    lowered(lambda x, y: (torch.div(x, y, rounding_mode=mode), torch.div(x, 2.5, rounding_mode=mode)), a, b)


@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_div_rounding_mode_int(device, mode, dtype):
    a, b = randi(7, 11, dtype=dtype, device=device), randi(7, 11, lo=-6, hi=6, dtype=dtype, device=device, nonzero=True)
    # trunc division of integers may run as an ATen fallback; it must be right either way
    check(lambda x, y: (torch.div(x, y, rounding_mode=mode), torch.div(x, 3, rounding_mode=mode),
                        torch.div(x, -3, rounding_mode=mode)), a, b)


def test_floor_division_exact_python_semantics(device):
    # floor(1.0 / 0.1) is 10 but 1.0 // 0.1 is 9 (0.1 is slightly above one tenth)
    a = torch.tensor([1.0, 1.0, -1.0, 7.0, 0.3, -0.0, 5.0], device=device)
    b = torch.tensor([0.1, -0.1, 0.1, 0.7, 0.1, 3.0, -2.0], device=device)
    lowered(lambda x, y: (torch.floor_divide(x, y), torch.remainder(x, y), x // y, x % y), a, b)


@pytest.mark.parametrize("dtype", [I32, I64, F32, F64])
def test_floor_divide_and_remainder_negative(device, dtype):
    if dtype.is_floating_point:
        a = randf(9, 13, lo=-30, hi=30, dtype=dtype, device=device)
        b = randf(9, 13, lo=0.5, hi=5, dtype=dtype, device=device) * torch.where(torch.rand(9, 13, device=device) > 0.5, 1, -1).to(dtype)
    else:
        a = randi(9, 13, lo=-50, hi=50, dtype=dtype, device=device)
        b = randi(9, 13, lo=-7, hi=7, dtype=dtype, device=device, nonzero=True)
    lowered(lambda x, y: (torch.floor_divide(x, y), torch.remainder(x, y), x // y, x % y,
                          torch.floor_divide(x, -3), torch.remainder(x, -3), torch.remainder(x, 4), x // 4), a, b)


def test_remainder_scalar_tensor(device):
    a = randi(9, lo=-7, hi=7, device=device, nonzero=True)
    lowered(lambda y: (torch.remainder(-17, y), torch.remainder(y, -3)), a)


def test_remainder_float_scalar_tensor(request, device):
    interpreter_xfail(request, device, "interp_libdevice._apply gives a libdevice call whose first argument is a "
                                       "0-d constant (libdevice.fmod(tl.full([], 5.5), x)) the 0-d type")
    a = randf(9, lo=0.5, hi=4, device=device)
    lowered(lambda y: torch.remainder(5.5, y), a)


@pytest.mark.parametrize("dtype", [I32, I64, F32])
def test_fmod(device, dtype):
    if dtype.is_floating_point:
        a, b = randf(8, 9, lo=-20, hi=20, device=device), randf(8, 9, lo=0.5, hi=4, device=device) * -1
    else:
        a, b = randi(8, 9, lo=-50, hi=50, dtype=dtype, device=device), randi(8, 9, lo=-7, hi=7, dtype=dtype, device=device, nonzero=True)
    lowered(lambda x, y: (torch.fmod(x, y), torch.fmod(x, 3), torch.fmod(x, -3)), a, b)


def test_atan2_hypot_copysign(device):
    a, b = randf(6, 7, device=device), randf(6, 7, device=device)
    lowered(lambda x, y: (torch.atan2(x, y), torch.hypot(x, y), torch.copysign(x, y), torch.copysign(x, -1.0)), a, b)


def test_atan2_of_ints(device):
    lowered(lambda x, y: torch.atan2(x, y), randi(5, 5, device=device), randi(5, 5, device=device))


def test_bool_add_and_mul(device):
    a, b = randb(6, 7, device=device), randb(6, 7, device=device)
    lowered(lambda x, y: (x + y, x * y, torch.maximum(x, y), torch.minimum(x, y)), a, b)


# --- pow ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exponent", [2, 3, 1, 0.5, -1, -2, 2.5, 0, -0.5, 4, 1.0, 2.0])
def test_pow_tensor_scalar(device, exponent):
    x = randf(6, 9, lo=0.2, hi=3, device=device)
    lowered(lambda a: torch.pow(a, exponent), x)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1])
def test_pow_tensor_scalar_negative_base(device, exponent):
    lowered(lambda a: a ** exponent, randf(40, lo=-3, hi=3, device=device))


def test_pow_tensor_tensor(device):
    a, b = randf(6, 9, lo=0.2, hi=3, device=device), randf(6, 9, lo=-2, hi=2, device=device)
    lowered(lambda x, y: (torch.pow(x, y), x ** y[0]), a, b)


def test_pow_scalar_tensor(device):
    b = randf(6, 9, lo=-2, hi=2, device=device)
    lowered(lambda y: (2 ** y, torch.pow(3.5, y), torch.pow(2, y)), b)


@pytest.mark.parametrize("exponent", [2, 3, 1, 0, 5])
def test_pow_int(device, exponent):
    x = randi(6, 9, lo=-9, hi=9, device=device)
    check(lambda a: a ** exponent, x)


def test_pow_int_tensor_tensor(device):
    a, b = randi(6, 9, lo=-5, hi=5, device=device), randi(6, 9, lo=0, hi=4, device=device)
    check(lambda x, y: (x ** y, 2 ** y), a, b)


def test_pow_int_tensor_float_exponent(device):
    x = randi(6, 9, lo=1, hi=9, device=device)
    lowered(lambda a: (a ** 0.5, a ** 2.0, a ** 1.5, a ** -1.0), x)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_pow_half(device, dtype):
    x = randf(6, 9, lo=0.2, hi=3, dtype=dtype, device=device)
    lowered(lambda a: (a ** 2, a ** 0.5, a ** 2.5, a ** a), x)


def test_pow_grad(device):
    a, b = randf(4, 5, lo=0.5, hi=2, device=device), randf(4, 5, lo=-1, hi=1, device=device)
    lowered(lambda x, y: x ** 2 + x ** 3.5 + x ** y + 2 ** y, a, b, grad=True)


# --- maximum / minimum -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32, I64])
def test_maximum_minimum(device, dtype):
    mk = (lambda *s: randf(*s, dtype=dtype, device=device)) if dtype.is_floating_point else \
        (lambda *s: randi(*s, dtype=dtype, device=device))
    lowered(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.max(x, y), torch.min(x, y)), mk(5, 8), mk(8))


def test_maximum_minimum_nan(device):
    nan = float("nan")
    a = torch.tensor([nan, 1.0, nan, -2.0, 3.0, -0.0], device=device)
    b = torch.tensor([1.0, nan, nan, -3.0, 3.0, 0.0], device=device)
    lowered(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y)), a, b)


def test_maximum_mixed_dtypes(device):
    lowered(lambda x, y: (torch.maximum(x, y), torch.minimum(y, x)), randi(5, 6, device=device),
            randf(5, 6, device=device))


def test_maximum_grad(device):
    lowered(lambda x, y: torch.maximum(x, y) * torch.minimum(x, y), randf(5, 6, device=device),
            randf(5, 6, device=device), grad=True)


# --- comparisons -------------------------------------------------------------------------------------------------

CMP = [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge]


@pytest.mark.parametrize("op", CMP, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [F32, F16, I32, I64, BOOL])
def test_comparisons(device, op, dtype):
    if dtype.is_floating_point:
        a, b = randf(6, 7, dtype=dtype, device=device).round(), randf(6, 7, dtype=dtype, device=device).round()
        s = 1.0
    elif dtype == BOOL:
        a, b, s = randb(6, 7, device=device), randb(6, 7, device=device), True
    else:
        a, b, s = randi(6, 7, lo=-3, hi=3, dtype=dtype, device=device), randi(6, 7, lo=-3, hi=3, dtype=dtype, device=device), 1
    lowered(lambda x, y: (op(x, y), op(x, s), op(x, y[0])), a, b)


@pytest.mark.parametrize("op", CMP, ids=lambda f: f.__name__)
def test_comparisons_mixed_dtypes(device, op):
    a = randi(6, 7, lo=-3, hi=3, device=device)
    b = randf(6, 7, lo=-3, hi=3, device=device)
    lowered(lambda x, y: (op(x, y), op(x, 0.5), op(y, x.to(torch.int32)), op(x, -1)), a, b)


def test_comparisons_nan(device):
    a = torch.tensor([float("nan"), 1.0, float("nan"), float("inf")], device=device)
    b = torch.tensor([1.0, float("nan"), float("nan"), float("inf")], device=device)
    lowered(lambda x, y: tuple(op(x, y) for op in CMP), a, b)


# --- logical and bitwise ---------------------------------------------------------------------------------------

LOGICAL = [torch.logical_and, torch.logical_or, torch.logical_xor]


@pytest.mark.parametrize("op", LOGICAL, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [BOOL, F32, I64])
def test_logical(device, op, dtype):
    if dtype == BOOL:
        a, b = randb(5, 9, device=device), randb(5, 9, device=device)
    elif dtype.is_floating_point:
        a, b = randf(5, 9, device=device).round(), randf(5, 9, device=device).round()
    else:
        a, b = randi(5, 9, lo=-2, hi=2, device=device), randi(5, 9, lo=-2, hi=2, device=device)
    lowered(lambda x, y: (op(x, y), op(x, y.bool()), torch.logical_not(x)), a, b)


@pytest.mark.parametrize("op", [torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [BOOL, I32, I64, U8, I8])
def test_bitwise(device, op, dtype):
    if dtype == BOOL:
        a, b, s = randb(5, 9, device=device), randb(5, 9, device=device), True
    else:
        lo, hi = (0, 255) if dtype == U8 else (-100, 100)
        a, b = randi(5, 9, lo=lo, hi=hi, dtype=dtype, device=device), randi(5, 9, lo=lo, hi=hi, dtype=dtype, device=device)
        s = 6
    lowered(lambda x, y: (op(x, y), op(x, s), torch.bitwise_not(x)), a, b)


def test_bitwise_mixed_int_dtypes(device):
    a, b = randi(5, 9, dtype=I32, device=device), randi(5, 9, dtype=I64, device=device)
    lowered(lambda x, y: (x & y, x | y, x ^ y, x & True), a, b)


@pytest.mark.parametrize("dtype", [I32, I64, I8, U8])
def test_shifts(device, dtype):
    bits = torch.iinfo(dtype).bits
    lo, hi = (0, 255) if dtype == U8 else (-100, 100)
    a = randi(5, 9, lo=lo, hi=hi, dtype=dtype, device=device)
    s = randi(5, 9, lo=0, hi=bits, dtype=dtype, device=device)
    lowered(lambda x, y: (x << y, x >> y, torch.bitwise_left_shift(x, 3), torch.bitwise_right_shift(x, 2)), a, s)


@pytest.mark.parametrize("dtype", [I32, I64, I8])
def test_shifts_out_of_range(device, dtype):
    # eager: a shift by >= the bit width (or a negative one) gives 0, or -1 for a right shift of a negative
    bits = torch.iinfo(dtype).bits
    a = torch.tensor([1, -5, 7, -1, 100, -100], dtype=dtype, device=device)
    s = torch.tensor([bits, bits, bits + 3, bits - 1, -1, -2], dtype=dtype, device=device)
    lowered(lambda x, y: (x << y, x >> y), a, s)
