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
