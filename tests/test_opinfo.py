"""A fast OpInfo subset: ~45 common ops, float32, 2 samples each, compiled with ember and compared with
eager by scripts/opinfo_sweep.py (the full sweep: `python scripts/opinfo_sweep.py --workers 2`).
A result that disagrees with tests/opinfo_expected_failures.json (an unlisted failure, or a listed
entry that now passes) fails the test."""
import importlib.util
import os

import pytest

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


@pytest.fixture(scope="module")
def ops():
    return sweep.load_ops()


@pytest.mark.parametrize("name", FAST_OPS)
def test_opinfo_fast(name, ops):
    assert name in ops, f"no OpInfo named {name}"
    results = sweep.run_op((name, ("float32",), 2, False, 60))
    expected = sweep.load_expected()
    unexpected = sweep.classify_unexpected(results, expected)
    assert not unexpected, "\n".join(f"{k}: {w}" for k, w in unexpected) + "\n" + "\n".join(
        f"  {s['status']}: {s['detail']} | {s['sample']}" for r in results for s in r["samples"])
