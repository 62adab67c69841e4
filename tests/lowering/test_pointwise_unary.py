"""Unary elementwise lowerings (float math, abs/neg/sign, rounding) against eager, on fresh random inputs.

`lowered(...)` (ember.testing) also asserts that no ATen fallback ran: the op really went through ember's lowering.
"""
import pytest
import torch

from ember.testing import lowered, randb, randf, randi

aten = torch.ops.aten
F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64, I8, U8, BOOL = torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool


# --- unary ops that produce floats --------------------------------------------------------------------------

# op -> (low, high) of the input domain
UNARY_FLOAT = {
    torch.exp: (-4, 4), torch.exp2: (-4, 4), torch.expm1: (-2, 2), torch.log: (0.05, 10), torch.log2: (0.05, 10),
    torch.log10: (0.05, 10), torch.log1p: (-0.9, 5), torch.sqrt: (0.0, 10), torch.rsqrt: (0.05, 10),
    torch.sin: (-6, 6), torch.cos: (-6, 6), torch.tan: (-1.3, 1.3), torch.asin: (-0.99, 0.99),
    torch.acos: (-0.99, 0.99), torch.atan: (-5, 5), torch.sinh: (-3, 3), torch.cosh: (-3, 3), torch.tanh: (-4, 4),
    torch.asinh: (-5, 5), torch.acosh: (1.0, 6), torch.atanh: (-0.95, 0.95), torch.erf: (-3, 3),
    torch.erfc: (-3, 3), torch.erfinv: (-0.95, 0.95), torch.sigmoid: (-6, 6), torch.lgamma: (0.1, 6),
    torch.reciprocal: (0.2, 4),
}


@pytest.mark.parametrize("op", list(UNARY_FLOAT), ids=lambda f: f.__name__)
def test_unary_float(device, op):
    lo, hi = UNARY_FLOAT[op]
    lowered(op, randf(7, 33, lo=lo, hi=hi, device=device))


@pytest.mark.parametrize("op", [torch.exp, torch.log, torch.sqrt, torch.sin, torch.tanh, torch.sigmoid,
                                torch.reciprocal, torch.rsqrt, torch.erf], ids=lambda f: f.__name__)
def test_unary_float_of_int(device, op):
    # integers promote to the default float dtype
    lowered(op, randi(5, 9, lo=1, hi=9, device=device))


@pytest.mark.parametrize("dtype", [F16, BF16, F64])
@pytest.mark.parametrize("op", [torch.exp, torch.log, torch.sqrt, torch.sin, torch.tanh, torch.sigmoid,
                                torch.erf], ids=lambda f: f.__name__)
def test_unary_float_dtypes(device, op, dtype):
    lowered(op, randf(6, 17, lo=0.1, hi=3, dtype=dtype, device=device))


def test_lgamma_negative_non_integers(device):
    x = randf(64, lo=-4.9, hi=-0.1, device=device)
    x = torch.where((x - x.round()).abs() < 0.05, x + 0.1, x)
    lowered(torch.lgamma, x)


def test_unary_float_grads(device):
    x = randf(5, 8, lo=0.2, hi=2, device=device)
    lowered(lambda a: a.exp() + a.log() + a.sqrt() + a.sin() + a.tanh() + a.sigmoid() + a.erf() + a.rsqrt(),
            x, grad=True)


# --- abs / neg / sign / square / relu ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32, I64])
@pytest.mark.parametrize("op", [torch.abs, torch.neg, torch.sign, torch.square, torch.relu],
                         ids=lambda f: f.__name__)
def test_unary_same_dtype(device, op, dtype):
    x = randf(9, 13, dtype=dtype, device=device) if dtype.is_floating_point else randi(9, 13, dtype=dtype, device=device)
    lowered(op, x)


def test_sign_and_relu_of_nan_and_signed_zero(device):
    x = torch.tensor([float("nan"), -0.0, 0.0, -2.5, 3.0, float("inf"), -float("inf")], device=device)
    lowered(lambda a: (torch.sign(a), torch.relu(a), torch.abs(a), torch.neg(a)), x)


def test_sign_of_bool(device):
    lowered(torch.sign, randb(20, device=device))


def test_abs_neg_relu_grads(device):
    lowered(lambda a: a.abs() * 2 + a.neg().relu() + a.square(), randf(4, 11, device=device), grad=True)


# --- floor / ceil / trunc / round -------------------------------------------------------------------------------

ROUNDING = [torch.floor, torch.ceil, torch.trunc, torch.round]


@pytest.mark.parametrize("op", ROUNDING, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
def test_rounding_float(device, op, dtype):
    x = randf(8, 21, lo=-10, hi=10, dtype=dtype, device=device)
    lowered(op, x)


@pytest.mark.parametrize("op", ROUNDING, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [I32, I64])
def test_rounding_int_is_identity(device, op, dtype):
    lowered(op, randi(8, 21, dtype=dtype, device=device))


def test_round_half_to_even(device):
    x = torch.arange(-10, 11, device=device, dtype=F32) + 0.5
    lowered(torch.round, x)


@pytest.mark.parametrize("decimals", [1, 2, 3, -1, -2])
def test_round_decimals(device, decimals):
    x = randf(50, lo=-500, hi=500, device=device)
    lowered(lambda a: torch.round(a, decimals=decimals), x)


def test_round_decimals_halfway_values(device):
    # x / 10 and x * 0.1 round differently on these; eager divides for negative decimals
    x = torch.tensor([25.0, 35.0, 45.0, -15.0, 0.5, 1.5, 2.675, 1.005, 0.125], device=device)
    lowered(lambda a: (torch.round(a, decimals=-1), torch.round(a, decimals=2), torch.round(a, decimals=1)), x)


@pytest.mark.parametrize("dtype", [F64, F16])
def test_round_decimals_other_float_dtypes(device, dtype):
    x = randf(40, lo=-50, hi=50, dtype=dtype, device=device)
    # CUDA's eager kernel rounds a*10 to the narrow type before nearbyint; ember keeps it in float32,
    # so a half-way case may land one ulp of the narrow type apart
    tol = {} if dtype in (torch.float32, torch.float64) else {"rtol": 0, "atol": 0.25}
    lowered(lambda a: torch.round(a, decimals=1), x, **({"rtol": 0, "atol": 0} if not tol else tol))
