"""Scan lowerings (ember/lowering/scan.py) against eager: cumsum, cumprod and logcumsumexp along every dim
of 1-D to 3-D inputs, short and long scanned dims (a persistent and a looped Triton kernel), strided
inputs, fused producers and consumers, `dtype=`, integer, bool and half inputs, special values, edge
sizes, gradients and dynamic shapes; none of them an ATen fallback."""
import math

import pytest
import torch

import ember
from ember.codegen.triton.heuristics import PERSISTENT_SCAN_MAX
from ember.testing import assert_close, check, default_tol, fresh_compile, lowered, randb, randf, randi

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64

OPS = {
    "cumsum": lambda a, d: torch.cumsum(a, d),
    "cumprod": lambda a, d: torch.cumprod(a, d),
    "logcumsumexp": lambda a, d: torch.logcumsumexp(a, d),
}
LENGTHS = [1, 7, PERSISTENT_SCAN_MAX - 1, 4 * PERSISTENT_SCAN_MAX + 1]   # the last two: persistent, looped


def _input(name, *shape, device, dtype=F32):
    if name == "cumprod":
        # magnitudes near 1, either sign: long products stay finite and away from zero
        sign = torch.where(randb(*shape, device=device), 1.0, -1.0)
        return (randf(*shape, lo=0.98, hi=1.02, device=device) * sign).to(dtype)
    return randf(*shape, device=device, dtype=dtype)


def _tol(n):
    """float32 tolerances for a scan of n steps: a sum's rounding error grows like sqrt(n) (eager's CPU
    kernels accumulate float32 in double)."""
    return {"rtol": max(1e-4, 1e-5 * math.sqrt(n)), "atol": max(1e-5, 1e-5 * math.sqrt(n))}


def _no_scan_fallbacks():
    scans = {"aten.cumsum.default", "aten.cumprod.default", "aten.logcumsumexp.default"}
    assert not scans & set(ember.metrics.fallbacks), dict(ember.metrics.fallbacks)


def test_scans_reach_the_lowering(device):
    # not decomposed away before lowering: each scan is one kernel of ember's own
    from ember.graph.decompose import decomposition_table
    aten = torch.ops.aten
    assert not {aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default} & set(decomposition_table())
    lowered(lambda a: a.cumsum(1), randf(4, 9, device=device))
    assert ember.metrics.generated_kernel_count == 1


# --- dims and lengths -----------------------------------------------------------------------------------------

SHAPES_DIMS = [((7,), 0), ((7,), -1), ((5, 7), 0), ((5, 7), 1), ((5, 7), -1),
               ((3, 7, 4), 0), ((3, 7, 4), 1), ((3, 7, 4), 2), ((3, 7, 4), -1), ((3, 7, 4), -3)]


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", list(OPS))
def test_scan_dims(device, name, shape, dim):
    op = OPS[name]
    lowered(lambda a: op(a, dim), _input(name, *shape, device=device))
    _no_scan_fallbacks()


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("name", list(OPS))
def test_scan_lengths(device, name, n):
    op = OPS[name]
    # along the last dim (contiguous rows) and along the first (rows strided in memory)
    lowered(lambda a, b: (op(a, -1), op(b, 0)), _input(name, 3, n, device=device),
            _input(name, n, 3, device=device), **_tol(n))


@pytest.mark.parametrize("n", [7, 4 * PERSISTENT_SCAN_MAX + 1])
@pytest.mark.parametrize("name", list(OPS))
def test_scan_middle_dim(device, name, n):
    op = OPS[name]
    lowered(lambda a: op(a, 1), _input(name, 2, n, 5, device=device), **_tol(n))


@pytest.mark.parametrize("name", list(OPS))
def test_non_contiguous_input(device, name):
    op = OPS[name]
    x = _input(name, 6, 9, 5, device=device)
    y = _input(name, 9, 8, device=device).t()[:, 1:]       # a strided graph input: strides (1, 8), offset 1
    lowered(lambda a, b: (op(a.transpose(0, 1), 0), op(a.permute(2, 0, 1), 2), op(a[:, ::2], 1), op(b, 1),
                          op(b, 0)), x, y)


# --- fusion ---------------------------------------------------------------------------------------------------

def test_fused_producer_and_consumer(device):
    x, y = randf(6, 50, device=device), randf(6, 50, device=device)
    lowered(lambda a, b: torch.cumsum(a * 2 + 1, 1) * b - 1, x, y)
    # the producer is inlined into the scan's input; the consumer is a kernel of its own
    assert ember.metrics.generated_kernel_count == 2


def test_scan_is_a_kernel_of_its_own(device):
    x = randf(6, 50, device=device)
    lowered(lambda a: (a.cumsum(1).sum(1), a.logcumsumexp(1) + 1), x)
    # the cumsum, then its row sums (a reduction over the same rows); the logcumsumexp, then the add
    assert ember.metrics.generated_kernel_count == 4


def test_scan_of_a_reduction_and_of_a_broadcast(device):
    x = randf(6, 50, device=device)
    lowered(lambda a: (torch.cumsum(a.amax(1), 0), torch.cumprod(a[:, :1].expand(6, 50) * 0.01 + 1, 1),
                       torch.logcumsumexp(a - a.mean(0), 0)), x)


# --- dtypes ---------------------------------------------------------------------------------------------------

def test_dtype_keyword(device):
    x = randf(5, 9, device=device)
    i = randi(5, 9, lo=-3, hi=4, device=device, dtype=torch.int32)
    h = randf(5, 9, device=device, dtype=F16)
    lowered(lambda a, b, c: (torch.cumsum(a, 1, dtype=F64), torch.cumprod(a * 0.1 + 1, 0, dtype=F64),
                             torch.cumsum(b, 1, dtype=F32), torch.cumprod(b, 0, dtype=torch.int32),
                             torch.cumsum(c, 1, dtype=F32), torch.cumsum(a, 0, dtype=F16)), x, i, h)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_inputs(device, dtype):
    if dtype == torch.bool:
        x = randb(6, 40, device=device)
    else:
        x = randi(6, 40, lo=0 if dtype == torch.uint8 else -20, hi=20, device=device, dtype=dtype)
    small = randi(6, 9, lo=-3, hi=4, device=device).to(dtype) if dtype != torch.bool else randb(6, 9, device=device)
    # integers and bools accumulate in int64, as in eager
    lowered(lambda a, b: (torch.cumsum(a, 1), torch.cumsum(a, 0), torch.cumprod(b, 1), torch.cumprod(b, 0)), x, small)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("name", list(OPS))
def test_half_inputs(device, name, dtype):
    """Against a float64 reference, not eager: eager's CUDA scans accumulate in the half type itself (its
    error grows along the row), ember accumulates in float32 as eager's CPU kernels do. ember must be
    within the dtype's rounding of the exact result, and never further from it than eager."""
    op = OPS[name]
    a, b = _input(name, 4, 300, device=device, dtype=dtype), _input(name, 300, 4, device=device, dtype=dtype)

    def fn(a, b):
        return op(a, 1), op(b, 0)
    got, eager, exact = fresh_compile(fn)(a, b), fn(a, b), fn(a.double(), b.double())
    _no_scan_fallbacks()
    rtol, atol = default_tol(dtype)
    for g, e, x in zip(got, eager, exact):
        assert g.dtype == e.dtype == dtype
        torch.testing.assert_close(g.double(), x, rtol=rtol, atol=atol)
        if device != "cpu":      # (the CPU interpreter truncates bfloat16 casts: it may trail eager there)
            assert (g.double() - x).abs().max() <= (e.double() - x).abs().max() * 1.01 + atol / 10


def test_float64(device):
    x = randf(4, 2000, device=device, dtype=F64)
    lowered(lambda a: (a.cumsum(1), (a * 0.01 + 1).cumprod(1), a.logcumsumexp(1), a.cumsum(0)), x)


# --- special values -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [9, 4 * PERSISTENT_SCAN_MAX + 1])
def test_logcumsumexp_infinities_and_nan(device, n):
    x = randf(5, n, device=device)
    x[0] = -float("inf")                       # nothing yet: -inf throughout
    x[1, :3] = -float("inf")
    x[2, 4] = float("inf")                     # inf from there on
    x[2, 6] = float("inf")
    x[3, 5] = float("nan")                     # nan from there on
    x[4, 1] = -float("inf")
    x[4, 7] = float("inf")
    lowered(lambda a: (a.logcumsumexp(1), a.logcumsumexp(0)), x, **_tol(n))


def test_logcumsumexp_large_values(device):
    # exp overflows float32 here; the running max keeps every step finite
    x = randf(4, 60, lo=80.0, hi=120.0, device=device)
    x[1] = -x[1]
    lowered(lambda a: a.logcumsumexp(1), x)


def test_cumsum_and_cumprod_special_values(device):
    x = randf(4, 20, device=device)
    x[0, 3] = float("inf")
    x[1, 5] = float("nan")
    x[2, 7] = 0.0
    x[3, 2] = -float("inf")
    lowered(lambda a: (a.cumsum(1), a.cumprod(1), a.cumsum(0)), x)


# --- edge sizes -----------------------------------------------------------------------------------------------

def test_zero_dim_input(device):
    x = torch.tensor(1.5, device=device)
    i = torch.tensor(3, device=device, dtype=torch.int32)
    lowered(lambda a, b: (a.cumsum(0), a.cumprod(-1), a.logcumsumexp(0), b.cumsum(0), b.cumprod(0)), x, i)


def test_size_one_scan_dim(device):
    x = randf(5, 1, 4, device=device)
    i = randi(5, 1, device=device, dtype=torch.int32)
    lowered(lambda a, b: (a.cumsum(1), a.cumprod(1), a.logcumsumexp(1), b.cumsum(1), a.cumsum(0)), x, i)


def test_zero_size(device):
    x, y = randf(3, 0, device=device), randf(0, 4, device=device)
    check(lambda a, b: (a.cumsum(1), a.cumprod(0), a.logcumsumexp(1), b.cumsum(0), b.cumsum(1), b.logcumsumexp(1)),
          x, y)
    _no_scan_fallbacks()


_TORCH_BEFORE_2_13 = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13)


# --- gradients ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [7, 4 * PERSISTENT_SCAN_MAX + 1])
@pytest.mark.parametrize("name", list(OPS))
def test_grads(device, name, n):
    if name == "cumprod" and n > PERSISTENT_SCAN_MAX and _TORCH_BEFORE_2_13:
        # torch 2.11 traces cumprod's backward as its O(n^2) composite loop (a prod, a cumprod and a cat
        # per element): 4097 of them take minutes to compile (the H200 run hung here); 2.13 traces O(n)
        pytest.skip("cumprod's backward is an O(n^2) graph on this torch")
    op = OPS[name]
    lowered(lambda a, b: (op(a, 1), op(b, 0)), _input(name, 3, n, device=device), _input(name, 5, 4, device=device),
            grad=True, **_tol(n))


def test_grads_through_producer_and_consumer(device):
    x = randf(4, 30, device=device)
    lowered(lambda a: ((torch.cumsum(a.sin(), 1) * a).sum(1) + torch.cumprod(a * 0.02 + 1, 1)[:, -1],
                       torch.logcumsumexp(a * 2, 0).mean(0)), x, grad=True)


def test_cumprod_grad_with_zeros(device):
    # the backward of cumprod treats zeros apart (its decomposition scans bools and masked values)
    x = randf(4, 12, lo=0.5, hi=1.5, device=device)
    x[0, 3] = 0.0
    x[1, 2] = 0.0
    x[1, 8] = 0.0
    lowered(lambda a: torch.cumprod(a, 1), x, grad=True)


# --- dynamic shapes -------------------------------------------------------------------------------------------

def test_dynamic_shapes_compile_once(device):
    def fn(a):
        return a.cumsum(-1), (a * 0.01 + 1).cumprod(0), a.logcumsumexp(1), a.cumsum(0, dtype=F64)
    compiled = fresh_compile(fn, dynamic=True)
    # lengths on both sides of the persistent Triton scan's limit, the longer first: its looped scan serves
    # every length (a shorter first length makes a persistent scan, guarded, and the longer one recompiles:
    # tests/codegen/test_dynamic_reductions.py)
    for rows, n in ((9, 4 * PERSISTENT_SCAN_MAX + 1), (5, 40)):
        x = randf(rows, n, device=device)
        assert_close(compiled(x), fn(x), **_tol(n))
    assert ember.metrics.graphs_compiled == 1
    assert ember.metrics.eager_fallbacks == 0
    assert not ember.metrics.fallbacks
