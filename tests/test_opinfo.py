"""A fast OpInfo subset: ~45 common ops, float32, 2 samples each, compiled with ember and compared with
eager by scripts/opinfo_sweep.py (the full sweep: `python scripts/opinfo_sweep.py --workers 2`), a few
in-place updates in float16 and bfloat16, a few matmuls on inputs at a storage offset, and a few ops'
weighted-loss gradients in float32 and float64. A result that disagrees with
tests/opinfo_expected_failures.json (an unlisted failure, or a listed entry that now passes) fails the
test. The harness's own checks (a permuted gradient, a changed input, a half-precision result off by
more than eager's rounding) are tested on functions that behave differently under compilation."""
import importlib.util
import os

import pytest
import torch

# torch's OpInfo database imports expecttest (the [test] extra installs it; a bare GPU machine may lack it)
pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs the expecttest package")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("opinfo_sweep", os.path.join(ROOT, "scripts", "opinfo_sweep.py"))
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)

FAST_OPS = [
    "add", "mul", "div.no_rounding_mode", "sub", "exp", "log", "sin", "tanh", "sigmoid", "sqrt", "rsqrt",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "softmax", "log_softmax",
    "sum", "mean", "amax", "argmax", "var", "logsumexp", "cumsum", "where", "clamp", "pow", "abs", "neg",
    "maximum", "eq", "lt", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "flatten",
    "cat", "stack", "gather", "index_select", "masked_fill", "nn.functional.layer_norm", "matmul", "mm",
    "bmm",
]


# float16 and bfloat16, outputs and inputs after the call: in-place updates the full sweep found wrong
HALF_OPS = ["_batch_norm_with_update", "nn.functional.batch_norm", "addcdiv", "addcmul", "index_put"]

# float32 inputs that start inside their storage (a nonzero storage offset), for ATen calls on views of them
OFFSET_OPS = ["mm", "matmul", "nn.functional.linear", "addmm"]

# weighted-loss gradients (float32 and float64): matmuls, reductions, layout ops whose backward permutes
# or broadcasts, and the ops whose gradients the full sweep found wrong
GRAD_OPS = [
    "mm", "bmm", "sum", "softmax", "nn.functional.layer_norm", "permute", "expand", "index_select", "cumsum",
    "linalg.householder_product",
]


def _explain(results, unexpected) -> str:
    """The failure message: each unexpected (op, dtype), then every sample's status."""
    return "\n".join(f"{k}: {w}" for k, w in unexpected) + "\n" + "\n".join(
        f"  {s['status']}: {s['detail']} | {s['sample']}" for r in results for s in r["samples"])


@pytest.fixture(scope="module")
def ops():
    return sweep.load_ops()


@pytest.mark.parametrize("name", FAST_OPS)
def test_opinfo_fast(name, ops):
    assert name in ops, f"no OpInfo named {name}"
    results = sweep.run_op((name, ("float32",), 2, False, 60))
    expected = sweep.load_expected()
    unexpected = sweep.classify_unexpected(results, expected)
    assert not unexpected, _explain(results, unexpected)


@pytest.mark.parametrize("name", HALF_OPS)
def test_opinfo_half_fast(name, ops):
    assert name in ops, f"no OpInfo named {name}"
    results = sweep.run_op((name, ("float16", "bfloat16"), 2, False, 90))
    assert {r["dtype"] for r in results} == {"float16", "bfloat16"}
    unexpected = sweep.classify_unexpected(results, sweep.load_expected())
    assert not unexpected, _explain(results, unexpected)


@pytest.mark.parametrize("name", OFFSET_OPS)
def test_opinfo_offset_inputs_fast(name, ops):
    assert name in ops, f"no OpInfo named {name}"
    results = sweep.run_op((name, ("float32",), 2, False, 60, 3))
    unexpected = sweep.classify_unexpected(results, sweep.load_expected())
    assert results and not unexpected, _explain(results, unexpected)


@pytest.mark.parametrize("name", GRAD_OPS)
def test_opinfo_grad_fast(name, ops):
    assert name in ops, f"no OpInfo named {name}"
    results = sweep.run_op((name, ("float32", "float64"), 2, True, 90))
    assert {r["dtype"] for r in results} == {"float32", "float64"}
    unexpected = sweep.classify_unexpected(results, sweep.load_expected(), grad=True)
    assert not unexpected, _explain(results, unexpected)


# --- the harness catches what it is for: each function is right in eager and wrong once compiled

def _sample(*args):
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(args[0], args=args[1:])


def _value_with_flipped_gradient(x):
    """x's value, whose gradient is the incoming gradient reversed along dim 0."""
    return x.detach() + (x.flip(0) - x.flip(0).detach())


def _flipped_gradient(x):
    return _value_with_flipped_gradient(x) if torch.compiler.is_compiling() else x * 1


def _bumps_its_input(x):
    """2 * x; once compiled it also adds 1 to x in place."""
    y = x * 2
    if torch.compiler.is_compiling():
        x.add_(1)
    return y


def _two_roundings_high(x):
    """x * 3 rounded once; once compiled, rounded and then moved up by two steps of the dtype."""
    y = x * 3
    if torch.compiler.is_compiling():
        y = torch.nextafter(torch.nextafter(y, y + 1), y + 1)
    return y


def test_weighted_loss_catches_a_permuted_gradient():
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    category, detail = sweep._run_sample(_flipped_gradient, _sample(x), torch.float64, True)
    assert category == "fail", detail
    # under a plain sum the same gradient is indistinguishable: the weights are what catch it
    g_sum = torch.autograd.grad(_value_with_flipped_gradient(x).sum(), x)[0]
    assert torch.equal(g_sum, torch.ones_like(x))


def test_input_updated_in_place_is_compared():
    category, detail = sweep._run_sample(_bumps_its_input, _sample(torch.randn(5, 4)), torch.float32, False)
    assert category == "fail" and "value[" in detail, detail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tolerance_is_eager_rounding(dtype):
    x = torch.randn(64, dtype=dtype) + 4
    category, detail = sweep._run_sample(_two_roundings_high, _sample(x), dtype, False)
    assert category == "fail", detail
