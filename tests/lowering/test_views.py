"""View lowerings (ember/lowering/views.py): views never copy; on stored buffers they become strided
views, on computed values they remap the index. Each case runs on a graph input (a stored buffer) and on
a computed value (an unstored Pointwise), is returned as an output, and (where float) is differentiated."""
import pytest
import torch

from ember.testing import check, lowered


# (name, view function, input shape)
VIEWS = [
    ("view_flat", lambda t: t.view(-1), (4, 6)),
    ("view_split", lambda t: t.view(2, 2, 3, 2), (4, 6)),
    ("view_infer", lambda t: t.view(3, -1), (4, 6)),
    ("view_infer_lead", lambda t: t.view(-1, 4), (4, 6)),
    ("reshape_merge", lambda t: t.reshape(4, 6), (2, 2, 6)),
    ("reshape_unit_dims", lambda t: t.reshape(1, 4, 1, 6, 1), (4, 6)),
    ("reshape_regroup", lambda t: t.reshape(3, 8), (4, 6)),
    ("reshape_of_transpose", lambda t: t.t().reshape(-1), (4, 6)),
    ("reshape_of_permute", lambda t: t.permute(2, 0, 1).reshape(5, 12), (3, 4, 5)),
    ("reshape_of_slice", lambda t: t[:, 1:5].reshape(2, -1), (4, 6)),
    ("reshape_of_step_slice", lambda t: t[::2].reshape(-1), (6, 5)),
    ("permute", lambda t: t.permute(2, 0, 1), (3, 4, 5)),
    ("permute_negative", lambda t: t.permute(-1, -3, -2), (3, 4, 5)),
    ("transpose", lambda t: t.transpose(0, 2), (3, 4, 5)),
    ("transpose_negative", lambda t: t.transpose(-1, -2), (3, 4, 5)),
    ("t", lambda t: t.t(), (4, 6)),
    ("t_1d", lambda t: t.t(), (6,)),
    ("mT", lambda t: t.mT, (2, 4, 6)),
    ("expand", lambda t: t.expand(3, 4, 6), (4, 1)),
    ("expand_minus_one", lambda t: t.expand(2, -1, 5), (4, 1)),
    ("expand_new_dims", lambda t: t.expand(2, 3, 6), (6,)),
    ("expand_as", lambda t: t[:1].expand_as(t), (4, 6)),
    ("broadcast_to", lambda t: torch.broadcast_to(t, (2, 4, 6)), (1, 6)),
    ("squeeze_all", lambda t: t.squeeze(), (1, 4, 1, 6)),
    ("squeeze_dim", lambda t: t.squeeze(2), (1, 4, 1, 6)),
    ("squeeze_negative", lambda t: t.squeeze(-2), (1, 4, 1, 6)),
    ("squeeze_dims", lambda t: t.squeeze((0, 2)), (1, 4, 1, 6)),
    ("squeeze_not_one", lambda t: t.squeeze(1), (1, 4, 1, 6)),
    ("unsqueeze_front", lambda t: t.unsqueeze(0), (4, 6)),
    ("unsqueeze_mid", lambda t: t.unsqueeze(1), (4, 6)),
    ("unsqueeze_end", lambda t: t.unsqueeze(-1), (4, 6)),
    ("unsqueeze_negative", lambda t: t.unsqueeze(-2), (4, 6)),
    ("none_index", lambda t: t[None, :, None], (4, 6)),
    ("slice", lambda t: t[1:3], (5, 6)),
    ("slice_dim1", lambda t: t[:, 2:], (5, 6)),
    ("slice_step", lambda t: t[::2, 1::3], (5, 7)),
    ("slice_negative", lambda t: t[-3:-1, :-2], (5, 6)),
    ("slice_negative_start_step", lambda t: t[-4::2], (7, 3)),
    ("slice_out_of_range", lambda t: t[2:100, -100:3], (5, 6)),
    ("slice_empty", lambda t: t[4:2], (5, 6)),
    ("narrow", lambda t: t.narrow(1, 1, 3), (5, 6)),
    ("select", lambda t: t[2], (5, 6)),
    ("select_negative", lambda t: t[:, -1], (5, 6)),
    ("select_negative_first", lambda t: t[-5], (5, 6)),
    ("select_int_and_slice", lambda t: t[1, 2:5], (5, 6)),
    ("unbind_first", lambda t: t.unbind(1)[2], (5, 6)),
    ("chunk", lambda t: t.chunk(3, dim=1)[1], (5, 6)),
    ("split", lambda t: t.split([2, 3], dim=0)[1], (5, 6)),
    ("chain", lambda t: t.permute(1, 0, 2)[1:, ::2].reshape(-1, 3).t()[1], (4, 5, 6)),
    ("chain_expand", lambda t: t[:, :1].unsqueeze(0).expand(2, -1, 3).transpose(0, 2), (4, 6)),
    ("chain_squeeze", lambda t: t.unsqueeze(1)[..., -2:].squeeze(1).flatten(), (4, 6)),
    ("flatten_unflatten", lambda t: t.flatten(1).unflatten(1, (5, 4)), (3, 4, 5)),
    ("movedim", lambda t: t.movedim(0, -1), (3, 4, 5)),
    ("swapaxes", lambda t: t.swapaxes(0, 1), (3, 4, 5)),
    ("view_as", lambda t: t.view_as(torch.empty(6, 4)), (4, 6)),
    ("alias_detach", lambda t: t.detach(), (4, 6)),
    ("diagonal", lambda t: t.diagonal(), (4, 4)),
    ("unfold", lambda t: t.unfold(0, 2, 1), (5, 3)),
]
IDS = [v[0] for v in VIEWS]


@pytest.mark.parametrize("name,view,shape", VIEWS, ids=IDS)
def test_view_of_input(device, name, view, shape):
    x = torch.randn(shape, device=device)
    # a view of an input, and the same view read by a computation
    check(lambda a: (view(a), view(a) * 2 + 1), x)


@pytest.mark.parametrize("name,view,shape", VIEWS, ids=IDS)
def test_view_of_computed(device, name, view, shape):
    x = torch.randn(shape, device=device)
    check(lambda a: (view(a.sin()), view(a * 3).cos() - 1), x)


@pytest.mark.parametrize("name,view,shape", VIEWS, ids=IDS)
def test_view_grad(device, name, view, shape):
    x = torch.randn(shape, device=device)
    check(lambda a: view(a.exp()) * 2 + view(a), x, grad=True)


@pytest.mark.parametrize("name,view,shape", [v for v in VIEWS if v[0] not in ("unfold", "diagonal", "narrow")],
                         ids=[v[0] for v in VIEWS if v[0] not in ("unfold", "diagonal", "narrow")])
def test_view_is_lowered(device, name, view, shape):
    # no view op falls back to ATen, neither on an input nor on a computed value
    x = torch.randn(shape, device=device)
    lowered(lambda a: (view(a) + 1, view(a * 2) - 1), x)


def test_view_of_non_contiguous_input(device):
    x = torch.randn(6, 4, device=device).t()          # a non-contiguous graph input
    lowered(lambda a: (a.reshape(-1) * 1, a.reshape(2, 12) + 1, a.reshape(4, 3, 2).sum(1)), x)


def test_view_of_sliced_input(device):
    base = torch.randn(8, 10, device=device)
    x = base[2:6, 1:9:2]                                # storage offset and strides
    lowered(lambda a: (a * 2, a.t() + 1, a.reshape(-1) - 1, a[1:, 1] * 3), x)


def test_view_of_expanded_input(device):
    x = torch.randn(4, 1, device=device).expand(4, 5)  # zero strides on an input
    lowered(lambda a: (a * 2, a.t().reshape(-1) + 1), x)


def test_view_of_realized_reduction(device):
    x = torch.randn(4, 6, 8, device=device)
    lowered(lambda a: (a.sum(1).t() * 2, a.amax(-1).reshape(-1) + 1, a.mean(0)[::2, 1:]), x)


def test_views_returned_unchanged_and_as_outputs(device):
    x = torch.randn(4, 6, device=device)
    out = check(lambda a: (a.t(), a[1:3], a.view(2, 12), a.unsqueeze(0), (a + 1).t(), (a * 2)[::2]), x)
    assert out[0].shape == (6, 4)


def test_output_view_strides_match_eager(device):
    x = torch.randn(4, 6, device=device)
    fn = lambda a: ((a + 1).t(), (a * 2)[:, 1::2])   # noqa: E731
    expected = fn(x)
    out = check(fn, x)
    assert [o.shape for o in out] == [e.shape for e in expected]


def test_views_of_a_shared_computed_base(device):
    x = torch.randn(4, 6, device=device)

    def fn(a):
        b = a * 2
        v = b.view(-1)
        return v[3:9] + 1, b.t()
    lowered(fn, x)


def test_as_strided_of_input(device):
    x = torch.randn(4, 6, device=device)
    check(lambda a: (torch.as_strided(a, (3, 3), (1, 6), 1) * 2, torch.as_strided(a, (2, 2), (6, 1))), x)


def test_as_strided_of_computed_non_contiguous(device):
    # eager's a.t() * 2 keeps a's transposed layout: as_strided reads that storage
    x = torch.randn(4, 6, device=device)
    check(lambda a: torch.as_strided((a.t() * 2), (3, 3), (1, 4)) + 1, x)


def test_views_with_different_dtypes(device):
    x = torch.randint(-5, 5, (4, 6), device=device)
    b = torch.rand(4, 6, device=device) > 0.5
    lowered(lambda a, m: (a.t()[1:] * 2, a.view(2, 12)[:, ::3], m.t().reshape(-1), m[::2].unsqueeze(0)), x, b)


def test_grad_through_view_chain(device):
    x = torch.randn(3, 4, 5, device=device)
    w = torch.randn(5, 4, device=device)
    check(lambda a, b: (a.permute(0, 2, 1)[:, 1:, ::2].reshape(3, -1) * b[1:, ::2].reshape(-1)).sin(),
          x, w, grad=True)


def test_grad_through_select_and_expand(device):
    x = torch.randn(4, 6, device=device)
    check(lambda a: (a[1] * a[-1]).unsqueeze(0).expand(3, -1) + a[:3, 2:3], x, grad=True)


def test_grad_of_view_outputs(device):
    x = torch.randn(4, 6, device=device)
    check(lambda a: ((a * 2).t(), a.sin()[1:3], a.cos().view(2, 12)), x, grad=True)


# A backward graph reads the forward's saved values with the strides and offsets of eager's fake tensors;
# a saved value that eager has as a view of an intermediate (offset, gaps) must be returned as that view.
SAVED_VIEWS = {
    "strided_slice": lambda a, b: ((a * 2)[1:, ::2].sin() * b[1:, ::2]).sum(),
    "glu_chunks": lambda a, b: (lambda p, q: p * q.sigmoid())(*(a * 2 + b).chunk(2, -1)).sum(),
    "select_row": lambda a, b: ((a.exp())[2].sin() * b[0]).sum(),
    "permuted_slice": lambda a, b: ((a + b).t()[1:4].tanh()).sum(),
    "split_sizes": lambda a, b: sum(t.sin().sum() * (i + 1) for i, t in enumerate((a * b).split([1, 2, 3], 1))),
    "view_of_input_slice": lambda a, b: ((a[1:, ::2].reshape(-1) * 3).sin() * b[1:, ::2].reshape(-1)).sum(),
}


@pytest.mark.parametrize("name", list(SAVED_VIEWS))
def test_saved_views_for_backward(device, name):
    a, b = torch.randn(6, 6, device=device), torch.randn(6, 6, device=device)
    check(SAVED_VIEWS[name], a, b, grad=True)
