"""cat / stack / constant_pad_nd lowered as pointwise kernels (fused with producers and consumers)."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import check


def _no_fallbacks():
    assert not ember.metrics.fallbacks, dict(ember.metrics.fallbacks)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_fuses(device, dim):
    x, y = torch.randn(4, 6, device=device), torch.randn(4, 6, device=device)
    check(lambda a, b: torch.cat([a.sin(), b * 2, a + b], dim) + 1, x, y, grad=True)
    _no_fallbacks()


def test_cat_promotes_dtypes(device):
    x, y = torch.randn(4, 5, device=device), torch.randn(4, 3, device=device)
    check(lambda a, b: torch.cat([a.to(torch.int32), b], 1), x, y)


def test_rotate_half(device):
    x = torch.randn(2, 3, 8, device=device)
    check(lambda a: torch.cat([-a[..., 4:], a[..., :4]], -1) * a, x)
    assert ember.metrics.generated_kernel_count == 1      # the cat fuses with the slices and the product
    check(lambda a: torch.cat([-a[..., 4:], a[..., :4]], -1) * a, x, grad=True)


def test_stack(device):
    x = torch.randn(3, 5, device=device)
    check(lambda a: torch.stack([a, a.cos(), a * 3], -1).sum(1), x, grad=True)
    _no_fallbacks()


def test_many_inputs_use_aten(device):
    xs = [torch.randn(2, 3, device=device) for _ in range(6)]
    check(lambda *a: torch.cat([t * 2 for t in a], 0), *xs)
    assert ember.metrics.fallbacks["aten.cat.default"] == 1


@pytest.mark.parametrize("pad", [(1, 2), (1, 2, 3, 0), (-1, -1, 0, 0), (2, -1, 0, 1)])
def test_constant_pad(device, pad):
    x = torch.randn(4, 5, device=device)
    check(lambda a: F.pad(a * 2, pad, value=1.5), x, grad=True)
    _no_fallbacks()
