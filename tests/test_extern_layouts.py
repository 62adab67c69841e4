"""An extern whose meta function promises another layout than its real kernel returns must never be
misread: ember checks extern outputs (tuple elements too) at run time; a mismatch makes the graph run
eagerly with a warning (or raises, with fallback_on_error=False)."""
import pytest
import torch

import ember

_lib = torch.library.Library("ember_test_layouts", "DEF")
_lib.define("pair(Tensor x) -> (Tensor, Tensor)")


def _real(x):
    return (x * 2).contiguous(), (x + 1).contiguous()


def _lying_fake(x):
    # claims the first output is stored transposed; the real kernel returns it contiguous
    return torch.empty(x.shape[::-1], dtype=x.dtype, device=x.device).t(), torch.empty_like(x)


_lib.impl("pair", _real, "CompositeExplicitAutograd")
torch.library.register_fake("ember_test_layouts::pair", _lying_fake)


def _fn(x):
    a, b = torch.ops.ember_test_layouts.pair(x)
    return a.sin() + b


def test_mismatched_tuple_output_layout_runs_eagerly():
    x = torch.randn(6, 4)
    with ember.config.patch(fallback_on_error=True):
        compiled = torch.compile(_fn, backend="ember")
        with pytest.warns(RuntimeWarning, match="unexpected layout"):
            out = compiled(x)
    torch.testing.assert_close(out, _fn(x))


def test_mismatched_layout_raises_when_asked():
    x = torch.randn(6, 4)
    with pytest.raises(AssertionError, match="unexpected layout"):
        torch.compile(_fn, backend="ember")(x)
