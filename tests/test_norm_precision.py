"""Half-precision normalization against a float32 reference: ember's error is at most about eager's.

Each test runs a normalization (BatchNorm in training and eval mode, LayerNorm, GroupNorm, and ResNet's
bottleneck without its ReLUs) in bf16 or fp16 under eager and under ember, and the same in float32 from
the same rounded weights, input and output gradient. It compares each result's root-mean-square error
against the float32 one, relative to the reference's size (one seed's largest error of a gradient through
a ReLU is decided by which pre-activations within a rounding of zero each backend passes, so models with
ReLUs are left to the probe, experiments/norm_precision_probe.py).

BatchNorm's saved statistics stay float32 from the forward to the backward (graph/passes/saved_precision.py),
where eager's CPU kernel and core ATen's decomposition round them to the input's dtype: with inputs whose
mean is large against their spread, ember's weight gradient is then within the dtype's rounding of the
reference, eager's some ten times further.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember.graph.passes import joint, saved_precision
from ember.testing import fresh_compile, precision_runs

HALF = [torch.bfloat16, torch.float16]
# root-mean-square relative error of a value rounded once to the dtype is at most about half its epsilon:
# a result within two epsilons had no more than a few roundings
ROUNDING = {torch.bfloat16: 2 * 2.0 ** -7, torch.float16: 2 * 2.0 ** -10}


def _batch_norm(c=16):
    norm = nn.BatchNorm2d(c)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(c) + 0.5)
        norm.bias.copy_(torch.randn(c))
        norm.running_mean.copy_(torch.randn(c) + 2)
        norm.running_var.copy_(torch.rand(c) * 8 + 1)
    return norm


def _errors(module, x, dtype, train=True):
    """{value: (ember's error, eager's error)}: root-mean-square difference from the float32 run of the
    same rounded module, input and output gradient, over the reference's root-mean-square."""
    ref, eager, ours = precision_runs(module, x, dtype, train)

    def rms(a, b):
        return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()
    return {k: (rms(ours[k], ref[k]), rms(eager[k], ref[k])) for k in ref}


def _assert_not_worse(errors, dtype, slack=1.5):
    for what, (ours, eager) in errors.items():
        assert ours <= slack * eager + ROUNDING[dtype] / 4, \
            f"{what}: ember's error {ours:.3g}, eager's {eager:.3g} (relative to the float32 reference)"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("scale, offset", [(3.0, 2.0), (0.5, 8.0)], ids=["randn*3+2", "randn*0.5+8"])
def test_batch_norm_training_gradients(device, dtype, scale, offset):
    x = torch.randn(8, 16, 12, 12, device=device) * scale + offset
    errors = _errors(_batch_norm(), x, dtype)
    _assert_not_worse(errors, dtype)
    for what in ("output", "input grad", "weight.grad", "bias.grad"):
        assert errors[what][0] <= ROUNDING[dtype], \
            f"{what}: ember's error {errors[what][0]:.3g} is more than {dtype}'s rounding"


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_conv_batch_norm_training_gradients(device, dtype):
    """ResNet's bottleneck (1x1, strided 3x3, 1x1 convolutions with BatchNorm, a downsampled residual)
    without its ReLUs."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(16, 8, 1, bias=False), _batch_norm(8)
            self.c2, self.b2 = nn.Conv2d(8, 8, 3, 2, 1, bias=False), _batch_norm(8)
            self.c3, self.b3 = nn.Conv2d(8, 32, 1, bias=False), _batch_norm(32)
            self.down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), _batch_norm(32))

        def forward(self, x):
            return self.b3(self.c3(self.b2(self.c2(self.b1(self.c1(x)))))) + self.down(x)
    errors = _errors(Block(), torch.randn(2, 16, 10, 10, device=device) * 3 + 2, dtype)
    # b2's bias feeds a BatchNorm through a convolution: its gradient is zero up to rounding
    errors.pop("b2.bias.grad")
    _assert_not_worse(errors, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_batch_norm_eval(device, dtype):
    x = torch.randn(8, 16, 12, 12, device=device) * 3 + 2
    _assert_not_worse(_errors(_batch_norm(), x, dtype, train=False), dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("norm, shape", [(lambda: nn.LayerNorm(256), (64, 256)),
                                         (lambda: nn.GroupNorm(4, 32), (8, 32, 10, 10))],
                         ids=["layer_norm", "group_norm"])
def test_layer_and_group_norm_training_gradients(device, dtype, norm, shape):
    module = norm()
    with torch.no_grad():
        module.weight.copy_(torch.rand_like(module.weight) + 0.5)
        module.bias.copy_(torch.randn_like(module.bias))
    _assert_not_worse(_errors(module, torch.randn(shape, device=device) * 3 + 2, dtype), dtype)


def test_forward_rounding_written_in_the_model_stays(device):
    """`x.to(bfloat16).float()` whose widened value the forward reads is the program's rounding: the pass
    leaves it. The output is the rounding's error, zero had the rounding been dropped (Triton's
    interpreter rounds by truncation, so its error is not eager's, only as large)."""
    def f(x, w):
        y = x * w
        return y.to(torch.bfloat16).float() - y
    x = torch.randn(64, 64, device=device) * 3
    w = torch.randn(64, device=device, requires_grad=True)
    got = fresh_compile(f)(x, w)
    got.sum().backward()
    y = (x * w).detach()
    assert (got != 0).float().mean() > 0.9
    assert bool((got.abs() <= y.abs() * 2.0 ** -7).all())
    torch.testing.assert_close(w.grad, torch.zeros_like(w), rtol=0, atol=1e-3)


def test_pass_widens_only_the_saved_statistics(device, monkeypatch):
    """In a bf16 BatchNorm's joint graph the pass removes the roundings of the saved mean and inverse
    standard deviation to bf16 and their widenings back (on the CPU, where the decomposition rounds them),
    and no other cast."""
    monkeypatch.setattr(joint, "PASSES", [p for p in joint.PASSES if p is not saved_precision.widen_saved_values])
    counts = []

    def widen(gm):
        casts = lambda: sum(1 for n in gm.graph.nodes if saved_precision.cast_dtype(n) is not None)  # noqa: E731
        before = casts()
        saved_precision.widen_saved_values(gm)
        counts.append(before - casts())
    norm = _batch_norm().to(device).to(torch.bfloat16)
    x = (torch.randn(4, 16, 6, 6, device=device) * 3 + 2).to(torch.bfloat16).requires_grad_()
    with ember.config.patch(joint_passes=[widen]):
        fresh_compile(norm)(x).sum().backward()
    assert counts == [4 if device == "cpu" else 0]
