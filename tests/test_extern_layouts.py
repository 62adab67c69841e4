"""An extern whose meta function promises another layout than its real kernel returns must never be
misread: ember checks extern outputs (tuple elements too) at run time; a mismatch makes the graph run
eagerly with a warning (or raises, with fallback_on_error=False)."""
import warnings

import pytest
import torch

import ember
from ember.runtime.checks import conform_layout
from ember.testing import check
from torch.fx.experimental.proxy_tensor import make_fx

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


def test_mismatched_tuple_output_layout_is_conformed():
    """The real output is contiguous, the meta function says transposed: the wrapper copies it into the
    promised layout, and the graph still runs compiled (no eager fallback, no warning)."""
    x = torch.randn(6, 4)
    with ember.config.patch(fallback_on_error=True):
        compiled = torch.compile(_fn, backend="ember")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = compiled(x)
    torch.testing.assert_close(out, _fn(x))
    assert ember.metrics.eager_fallbacks == 0


def test_conform_layout_copies_strides_and_refuses_wrong_sizes():
    t = torch.randn(4, 6)
    c = conform_layout(t, (4, 6), (1, 4), "buf0")
    assert c.stride() == (1, 4) and torch.equal(c, t)
    assert conform_layout(t, (4, 6), (6, 1), "buf0") is t
    assert conform_layout(t, (4, 6), (6, 1), "buf0", torch.float32) is t
    with pytest.raises(AssertionError, match="unexpected layout"):
        conform_layout(t, (6, 4), (4, 1), "buf0")


def test_conform_layout_converts_a_wrong_dtype():
    t = torch.randn(4, 6, dtype=torch.bfloat16)
    c = conform_layout(t, (4, 6), (6, 1), "buf0", torch.float32)
    assert c.dtype == torch.float32 and torch.equal(c, t.float())


_lib.define("stats(Tensor x) -> Tensor")
_lib.impl("stats", lambda x: x.sum(0), "CompositeExplicitAutograd")
# claims float32 for any input, as _batch_norm_with_update_functional's meta says of its running statistics
torch.library.register_fake("ember_test_layouts::stats", lambda x: x.sum(0).float())


def test_extern_output_of_another_dtype_than_its_meta_is_converted():
    """The real kernel returns bfloat16 where the meta function promised float32: ember's kernels would
    read two bfloat16 values as one float32 (a silent wrong answer); the wrapper converts it instead."""
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    f = lambda t: torch.ops.ember_test_layouts.stats(t) * 2   # noqa: E731
    gm = make_fx(f, tracing_mode="fake")(x)
    out = ember.compile_graph(gm, [x])([x])[0]
    torch.testing.assert_close(out, x.sum(0).float() * 2)


_lib.define("view_pair(Tensor(a) x) -> Tensor(a)")
_lib.impl("view_pair", lambda x: x.view(x.shape), "CompositeExplicitAutograd")
torch.library.register_fake("ember_test_layouts::view_pair", lambda x: x.t().contiguous().t())


def test_mismatched_aliasing_output_raises_when_asked():
    """An output that aliases an input cannot be replaced by a copy: the check raises instead."""
    x = torch.randn(6, 4)
    with pytest.raises(AssertionError, match="unexpected layout"):
        gm = make_fx(lambda t: torch.ops.ember_test_layouts.view_pair(t).sin())(x)
        ember.compile_graph(gm, [x])([x])


def test_extern_layout_follows_the_device_specific_meta(device):
    """On CPU, LAPACK's SVD returns Vh column-major; the meta device's function says row-major. ember must
    take the layout for the real device, or the backward (which reads Vh as AOTAutograd saw it) is wrong."""
    check(lambda a: torch.linalg.svdvals(a), torch.randn(5, 5, device=device), grad=True)
    check(lambda a: torch.linalg.matrix_norm(a, "nuc"), torch.randn(4, 6, device=device), grad=True)
