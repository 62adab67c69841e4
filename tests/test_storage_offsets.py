"""Views that start inside their storage (nonzero storage offset): kernels get the tensor itself,
whose data pointer already includes the offset, so indices must not add it again."""
import torch

from ember.testing import check


def test_input_with_storage_offset(device):
    base = torch.randn(3, 64, device=device)
    check(lambda x: x * 2 + 1, base[1])


def test_fallback_output_with_offset(device):
    # split_with_sizes runs as an ATen fallback whose outputs are views at offsets
    check(lambda y: y.split(64, -1)[1] * 2 + y.split(64, -1)[2], torch.randn(4, 192, device=device))


def test_mutating_an_input_with_offset(device):
    def f(x):
        x.mul_(2)
        return x.sum()
    base_e = torch.randn(3, 64, device=device)
    base_c = base_e.clone()
    expected = f(base_e[1])
    actual = torch.compile(f, backend="ember")(base_c[1])
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(base_c, base_e)


def test_reduction_over_offset_view(device):
    check(lambda x: torch.softmax(x[:, 3:], -1), torch.randn(5, 40, device=device))


def test_unbind_grads_of_separate_tangents(device):
    """The backward's fake tangents say slices of one storage at offsets 0..4; the real grads of unbind's
    outputs are separate tensors: views of them must be taken from their own offsets."""
    x = torch.randn(5, device=device, requires_grad=True)
    outs = torch.compile(lambda t: torch.unbind(t, 0), backend="ember")(x)
    (g,) = torch.autograd.grad(sum(o.sum() for o in outs), [x])
    torch.testing.assert_close(g, torch.ones_like(x))
    y = torch.randn(5, 5, device=device, requires_grad=True)
    outs = torch.compile(lambda t: torch.unbind(t, 1), backend="ember")(y)
    (g,) = torch.autograd.grad(sum((o * o).sum() for o in outs), [y])
    torch.testing.assert_close(g, 2 * y.detach())


def test_extern_reads_a_view_of_an_input_with_offset(device):
    """An ATen call on a view of an input that starts inside its storage: the wrapper's view is taken past
    the input's own offset, once (x.t() @ y on a slice read memory past the slice). Called directly:
    check() would clone the slice into a tensor of its own."""
    y = torch.randn(6, 2, device=device)
    x = torch.randn(10, 3, device=device)[4:]
    torch.testing.assert_close(torch.compile(lambda x, y: x.t() @ y, backend="ember")(x, y), x.t() @ y)
    x = torch.randn(12, 3, device=device)[5:]
    torch.testing.assert_close(torch.compile(lambda x, y: torch.mm(x[1:].t(), y), backend="ember")(x, y),
                               torch.mm(x[1:].t(), y))


def test_input_offset_other_than_traced(device):
    """Dynamo does not guard a storage offset: the graph compiled for one slice runs on another."""
    f = torch.compile(lambda x, y: (x.t() @ y, x.t() * 2), backend="ember")
    y = torch.randn(6, 2, device=device)
    for start in (4, 0, 7):
        x = torch.randn(13, 3, device=device)[start:start + 6]
        mm, scaled = f(x, y)
        torch.testing.assert_close(mm, x.t() @ y)
        torch.testing.assert_close(scaled, x.t() * 2)


def test_householder_product_grads(device):
    """linalg.householder_product's backward reads saved slices of one forward buffer (views at offsets)
    through matmuls; its gradients were wrong before the wrapper took each view past its base's offset."""
    if device != "cpu":
        import pytest
        pytest.skip("LAPACK's householder_product: the CPU is enough to reach the wrapper's views")
    for dtype in (torch.float32, torch.float64):
        for m, n in ((5, 5), (6, 4)):
            check(torch.linalg.householder_product, torch.randn(m, n, dtype=dtype), torch.randn(n, dtype=dtype),
                  grad=True)
