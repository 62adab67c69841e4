"""cat / stack / constant_pad_nd / slice_scatter / select_scatter / as_strided_scatter lowered as pointwise
kernels (fused with producers and consumers)."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import assert_close, check, fresh_compile


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


def test_rotate_half_backward_has_no_scatter_call(device):
    """The backward of a rotary embedding's halves (slice_scatter into zeros, twice, then added) is pointwise:
    no ATen call, one kernel with the products around it."""
    x = torch.randn(2, 3, 8, device=device)
    check(lambda a: torch.cat([-a[..., 4:], a[..., :4]], -1) * a, x, grad=True)
    _no_fallbacks()


@pytest.mark.parametrize("dim,start,end,step", [(2, 2, None, 1), (2, 0, 3, 1), (1, 2, 9, 3), (1, -4, None, 1),
                                                (1, -3, -1, 1), (1, 5, 100, 2), (0, 1, 3, 1), (1, 4, 4, 1)])
def test_slice_scatter(device, dim, start, end, step):
    """src written over x[start:end:step] along dim (negative bounds, bounds past the size, steps, an empty
    slice), fused with what computes x and src and with the reader."""
    x = torch.randn(4, 10, 6, device=device)
    where = [slice(None)] * 3
    where[dim] = slice(start, end, step)
    src = torch.randn_like(x[tuple(where)])
    check(lambda x, src: torch.slice_scatter(x * 2, src.sin(), dim, start, end, step) + 1, x, src)
    _no_fallbacks()
    assert ember.metrics.generated_kernel_count == 1


@pytest.mark.parametrize("start,end", [(2, None), (-3, None), (1, -2)])
def test_slice_scatter_of_a_dynamic_size(device, start, end):
    """Along a symbolic size, bounds are normalized under guards on the example size: two sizes, one graph,
    no ATen call."""
    f = fresh_compile(lambda x, src: torch.slice_scatter(x, src, 1, start, end).exp(), dynamic=True)
    for n in (10, 13):
        x = torch.randn(3, n, device=device)
        src = torch.randn_like(x[:, start:end])
        assert_close(f(x, src), torch.slice_scatter(x, src, 1, start, end).exp())
    _no_fallbacks()
    assert ember.metrics.graphs_compiled == 1


def test_slice_scatter_from_the_start_along_a_strided_size(device):
    """A slice from 0 along a size sympy cannot compare with 0 (FloorDiv(s + 1, 2), a strided slice's or a
    strided convolution's output, under dynamic shapes): no comparison is needed, no ATen call."""
    f = fresh_compile(lambda x, src: torch.slice_scatter(x[:, ::2].exp(), src, 1, 0, None) + 1, dynamic=True)
    for n in (10, 13):
        x = torch.randn(3, n, device=device)
        src = torch.randn_like(x[:, ::2])
        assert_close(f(x, src), torch.slice_scatter(x[:, ::2].exp(), src, 1, 0, None) + 1)
    _no_fallbacks()


@pytest.mark.parametrize("dim,index", [(0, 1), (1, -1), (2, 3)])
def test_select_scatter(device, dim, index):
    x = torch.randn(4, 10, 6, device=device)
    src = torch.randn_like(x.select(dim, index))
    check(lambda x, src: torch.select_scatter(x, src * 3, dim, index).cos(), x, src, grad=True)
    _no_fallbacks()


@pytest.mark.parametrize("base,size,stride,offset", [
    ((640,), (2, 320), (320, 1), 0),                  # the whole storage, row-major
    ((640,), (2, 320, 1, 1), (320, 1, 1, 1), 0),       # size-1 dims (their strides are never used)
    ((100,), (3, 4), (1, 3), 7),                       # a column-major block at an offset
    ((6, 8), (4, 5), (5, 1), 3),                       # into a 2-D tensor's storage
    ((4, 6), (0, 3), (3, 1), 0),                       # nothing written
])
def test_as_strided_scatter(device, base, size, stride, offset):
    """src written over a dense block of x's storage: one pointwise kernel with what computes x and src."""
    x, src = torch.randn(base, device=device), torch.randn(size, device=device)
    check(lambda x, src: torch.as_strided_scatter(x * 2, src.sin(), size, stride, offset) + 1, x, src)
    _no_fallbacks()
    assert ember.metrics.generated_kernel_count == 1


def test_as_strided_scatter_into_a_transposed_tensor(device):
    """The view addresses the storage of a clone of x, which keeps x's (here transposed) strides."""
    x, src = torch.randn(6, 8, device=device), torch.randn(4, 5, device=device)
    check(lambda x, src: torch.as_strided_scatter(x.t() * 2, src, (4, 5), (5, 1), 3), x, src)
    _no_fallbacks()


def test_as_strided_scatter_with_overlapping_positions_runs_in_aten(device):
    """A view that is not a dense block (here every other position of each row) stays an ATen call."""
    x, src = torch.randn(4, 6, device=device), torch.randn(2, 3, device=device)
    check(lambda x, src: torch.as_strided_scatter(x * 2, src, (2, 3), (12, 2), 1), x, src)
    assert dict(ember.metrics.fallbacks) == {"aten.as_strided_scatter.default": 1}


def test_gradient_of_a_restrided_pool_has_no_scatter_call(device):
    """A classifier head that restrides its pooled features (`as_strided` to channels-last strides, as
    timm's ConvNeXt head traces): the backward's as_strided_scatter is pointwise."""
    x = torch.randn(2, 8, 3, 3, device=device)
    check(lambda x: torch.as_strided(x.sin().mean((2, 3), keepdim=True), (2, 8, 1, 1), (8, 1, 8, 8))
          .permute(0, 2, 3, 1).cos(), x, grad=True)
    _no_fallbacks()


def test_stack(device):
    x = torch.randn(3, 5, device=device)
    check(lambda a: torch.stack([a, a.cos(), a * 3], -1).sum(1), x, grad=True)
    _no_fallbacks()


def test_many_inputs_cat_in_groups(device):
    # past MAX_POINTWISE_CAT_INPUTS inputs, groups of them are cat into buffers, then those are cat: still
    # ember's kernels (torch 2.11 traces cumprod's backward with cats of one input per element)
    xs = [torch.randn(2, 1 + i % 3, device=device, requires_grad=True) for i in range(19)]
    check(lambda *a: torch.cat([t * (i + 1) for i, t in enumerate(a)], 1).sin(), *xs, grad=True)
    _no_fallbacks()
    ints = [torch.randint(-5, 5, (3, 2), device=device) for _ in range(10)]
    check(lambda *a: torch.cat(list(a[:9]) + [a[9].float() * 0.5], 0), *ints)      # promotes across groups
    _no_fallbacks()


@pytest.mark.parametrize("pad", [(1, 2), (1, 2, 3, 0), (-1, -1, 0, 0), (2, -1, 0, 1)])
def test_constant_pad(device, pad):
    x = torch.randn(4, 5, device=device)
    check(lambda a: F.pad(a * 2, pad, value=1.5), x, grad=True)
    _no_fallbacks()
