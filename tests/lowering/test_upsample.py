"""Upsampling (nearest, nearest-exact, bilinear) and its backwards, lowered to Pointwise kernels.

torch.compile hands ember these ops already decomposed (PyTorch's Python dispatcher rewrites them into
aten.index / index_put while AOTAutograd traces), so the lowerings are tested on ATen graphs given to
ember.compile_graph, against the eager ATen op; one test covers the torch.compile path end to end."""
import math

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.testing import assert_close, check, fresh_compile

aten = torch.ops.aten
IN = [2, 3, 9, 11]


def _run_aten(fn, *args, trace=make_fx, rtol=None, atol=None, cpu_reference=False):
    """Compile fn's ATen graph with ember.compile_graph; compare with eager; no op may fall back.
    cpu_reference: compare with eager's CPU kernels, where eager's CUDA kernels are not the reference
    (scales that point past the input: CUDA's bilinear forward reads past the last row instead of
    clamping to it, and its nearest backward drops the gradient of the output rows clamped onto the last
    input row; the CPU kernels clamp, as the forward's definition does, and so does ember)."""
    gm = trace(fn) if trace is torch.fx.symbolic_trace else trace(fn, tracing_mode="fake")(*args)
    out = ember.compile_graph(gm, list(args))(list(args))
    expected = fn(*[a.cpu() for a in args]) if cpu_reference else fn(*args)
    assert_close(out[0].cpu() if cpu_reference else out[0], expected, rtol, atol)
    assert not ember.metrics.fallbacks, dict(ember.metrics.fallbacks)


SIZES = {   # output size, (scales_h, scales_w)
    "2x": ((18, 22), (None, None)),
    "odd": ((13, 7), (None, None)),
    "scales_1.5": ((13, 16), (1.5, 1.5)),
    "down": ((4, 6), (None, None)),
    "3x": ((27, 33), (3.0, 3.0)),
    "same": ((9, 11), (None, None)),
    "inconsistent_scales": ((20, 20), (2.0, 2.0)),    # sources past the input are clamped to its end
}


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize("exact", [False, True], ids=["nearest", "exact"])
def test_upsample_nearest2d_and_backward(device, name, exact):
    size, scales = SIZES[name]
    fw = aten._upsample_nearest_exact2d.default if exact else aten.upsample_nearest2d.default
    bw = aten._upsample_nearest_exact2d_backward.default if exact else aten.upsample_nearest2d_backward.default
    cpu_ref = name == "inconsistent_scales"
    _run_aten(lambda a: fw(a, list(size), *scales), torch.randn(IN, device=device), cpu_reference=cpu_ref)
    _run_aten(lambda g: bw(g, list(size), IN, *scales), torch.randn(IN[:2] + list(size), device=device),
              cpu_reference=cpu_ref)


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_bilinear2d_and_backward(device, name, align_corners):
    size, scales = SIZES[name]
    cpu_ref = name == "inconsistent_scales"
    _run_aten(lambda a: aten.upsample_bilinear2d.default(a, list(size), align_corners, *scales),
              torch.randn(IN, device=device), cpu_reference=cpu_ref)
    _run_aten(lambda g: aten.upsample_bilinear2d_backward.default(g, list(size), IN, align_corners, *scales),
              torch.randn(IN[:2] + list(size), device=device), cpu_reference=cpu_ref)


@pytest.mark.parametrize("fn", [
    lambda a: aten.upsample_nearest2d.vec(a, None, [1.5, 2.0]),
    lambda a: aten._upsample_nearest_exact2d.vec(a, None, [1.7, 0.6]),
    lambda a: aten.upsample_bilinear2d.vec(a, None, False, [1.5, 2.0]),
    lambda a: aten.upsample_bilinear2d.vec(a, [5, 20], True, None),
], ids=["nearest", "exact", "bilinear", "bilinear_size"])
def test_upsample_vec_overloads(device, fn):
    _run_aten(fn, torch.randn(IN, device=device), trace=torch.fx.symbolic_trace)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_upsample_low_precision(device, dtype):
    x = torch.randn(IN, device=device, dtype=dtype)
    _run_aten(lambda a: aten.upsample_nearest2d.default(a, [13, 7]), x)
    _run_aten(lambda a: aten.upsample_bilinear2d.default(a, [13, 16], False, 1.5, 1.5), x)
    _run_aten(lambda a: aten.upsample_bilinear2d.default(a, [13, 7], True), x)


def test_upsample_channels_last(device):
    x = torch.randn(2, 4, 9, 11, device=device).to(memory_format=torch.channels_last)
    _run_aten(lambda a: aten.upsample_nearest2d.default(a, [18, 22]) * 2, x)
    _run_aten(lambda a: aten.upsample_bilinear2d.default(a, [13, 7], False), x)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bilinear_ac"])
def test_interpolate_through_torch_compile(device, mode):
    kw = {"mode": "bilinear", "align_corners": True} if mode == "bilinear_ac" else {"mode": mode}
    check(lambda a: F.interpolate(a, size=(13, 7), **kw), torch.randn(IN, device=device), grad=True)
    assert not [op for op in ember.metrics.fallbacks if "upsample" in op or "index" in op]


@pytest.mark.parametrize("resize", [
    lambda a: F.interpolate(a, size=(13, 20), mode="bilinear"),
    lambda a: F.interpolate(a, scale_factor=0.6, mode="bilinear", align_corners=True),
    lambda a: F.interpolate(a, size=(13, 20), mode="bicubic"),
    lambda a: F.interpolate(a, size=(13, 20), mode="bilinear", antialias=True),
    lambda a: F.upsample_bilinear(a, size=(31, 8)),
    torch.nn.Upsample(scale_factor=1.5, mode="bilinear"),
], ids=["bilinear", "bilinear_scale_ac", "bicubic", "bilinear_antialias", "upsample_bilinear", "module"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_integer_resizes_are_eagers(device, resize, layout):
    """A uint8 image resized as eager's integer kernel does (fixed-point weights), not as the float
    decomposition AOTAutograd's trace would substitute (one off in many pixels): the exact pixel values,
    from one call of eager's kernel, with the ops around it compiled."""
    x = torch.randint(0, 256, (2, 3, 27, 26), dtype=torch.uint8, device=device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    try:
        expected = resize(x) // 2
    except (RuntimeError, NotImplementedError) as e:     # no integer kernel for this mode on this device
        pytest.skip(str(e).splitlines()[0])
    out = check(lambda a: resize(a + 0) // 2, x)
    assert torch.equal(out, expected)
    assert dict(ember.metrics.fallbacks) == {"ember.integer_resize.default": 1}


@pytest.mark.parametrize("resize", [
    lambda a: F.interpolate(a, size=(10, 3), mode="bilinear"),
    lambda a: F.interpolate(a, size=(a.shape[-1] + 1, a.shape[-2] // 3), mode="bilinear", align_corners=True),
    lambda a: F.interpolate(a, size=(int(math.ceil(a.shape[-1] / 2) * 2), math.floor(a.shape[-2] / 3)),
                            mode="bilinear"),
    lambda a: F.interpolate(a, size=(7, 5), mode="bicubic"),
], ids=["fixed_size", "size_of_sizes", "ceil_floor", "bicubic"])
def test_resize_of_dynamic_sizes(device, resize):
    """Under dynamic shapes the scales are quotients of sizes (`s / 10`): Python's true division, computed in
    float64 as Python does; as an index expression they divided as integers (every value wrong). math.ceil
    and math.floor of such quotients are sizes."""
    f = fresh_compile(resize, dynamic=True)
    for n in (9, 12):
        x = torch.randn(2, 3, n, n + 1, device=device)
        assert_close(f(x), resize(x))
    assert ember.metrics.eager_fallbacks == 0


@pytest.mark.parametrize("resize", [
    lambda a: F.interpolate(a, scale_factor=1.5, mode="nearest"),
    lambda a: F.interpolate(a, scale_factor=0.5, mode="nearest-exact"),
    lambda a: F.interpolate(a, scale_factor=2, mode="bicubic"),
    lambda a: F.interpolate(a, scale_factor=(1.25, 2.0), mode="bilinear", align_corners=True),
], ids=["nearest_1.5", "nearest_exact_0.5", "bicubic_2", "bilinear_1.25_2"])
def test_resize_by_scale_factor_of_dynamic_sizes(device, resize):
    """A scaled size is trunc(float(s) * scale). Where the scale has few significant bits the float product is
    exact, so the size is the fraction's floor (floor(3*s/2) for 1.5) and the graph compiles; forward and
    backward against eager on sizes where the product is and is not a whole number."""
    f = fresh_compile(resize, dynamic=True)
    for n in (5, 8, 11):
        x = torch.randn(2, 3, n, n + 3, device=device, requires_grad=True)
        out = f(x)
        grad = torch.randn_like(out)
        (got,) = torch.autograd.grad(out, x, grad)
        expected = resize(x)
        (want,) = torch.autograd.grad(expected, x, grad)
        assert out.shape == expected.shape
        assert_close(out, expected)
        assert_close(got, want)
    assert ember.metrics.eager_fallbacks == 0


def test_resize_by_a_scale_that_rounds_in_float_runs_eagerly(device):
    """trunc(float(10) * 1.7) is 17 where the exact product of 10 and the float nearest 1.7 is below 17: no
    exact size expression reproduces Python's rounding, so the graph runs eagerly, with eager's sizes."""
    resize = lambda a: F.interpolate(a, scale_factor=1.7, mode="nearest")  # noqa: E731
    f = fresh_compile(resize, dynamic=True)
    with ember.config.patch(fallback_on_error=True), pytest.warns(RuntimeWarning, match="run it eagerly"):
        for n in (10, 7):
            x = torch.randn(1, 2, n, n, device=device)
            out = f(x)
            assert out.shape == resize(x).shape and torch.equal(out, resize(x))
    assert ember.metrics.eager_fallbacks >= 1
