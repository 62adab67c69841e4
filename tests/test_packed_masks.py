"""Dropout masks kept for the backward as bits (graph/passes/packed_masks.py): the forward draws the keep
flags as one uint8 per eight elements (ember::dropout_bits), computes its output from them and saves them
instead of a bool per element, and the backward's gradient is still the forward's mask times the scale.
ember's random values are not eager's, so the checks read the mask off the output."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.graph.passes import packed_masks
from ember.testing import fresh_compile


@pytest.fixture
def small_masks_packed(monkeypatch):
    monkeypatch.setattr(packed_masks, "MIN_PACKED_ELEMENTS", 8)


def _saved(fn, *args):
    """fn's output and the (dtype, numel) of each tensor its graph saves for the backward."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 96), (4, 16, 40)])
def test_the_backward_reads_the_forward_mask_from_its_bits(device, small_masks_packed, dtype, shape):
    p = 0.3
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(shape, device=device, dtype=dtype)
    fn = fresh_compile(lambda a, b: F.dropout(a.sin(), p, True) * b)
    graphs = []
    with ember.config.patch(post_grad_passes=[lambda gm: graphs.append(gm.graph)]):
        y, saved = _saved(fn, x, w)
    g = torch.randn_like(y)
    y.backward(g)
    kept = y != 0
    assert 0.5 < kept.float().mean().item() < 0.9
    expected = torch.where(kept, (g * w).float() * (1.0 / (1 - p)) * x.detach().float().cos(), 0.0)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(x.grad.float(), expected, rtol=tol, atol=tol)
    numel = x.numel()
    assert (torch.uint8, numel // 8) in saved and (torch.bool, numel) not in saved
    assert not ember.metrics.fallbacks and ember.metrics.eager_fallbacks == 0
    # the forward draws the bits once (ember::dropout_bits), and the dropout's own draw is gone
    targets = [n.target for n in graphs[0].nodes]
    assert targets.count(torch.ops.ember.dropout_bits.default) == 1
    assert torch.ops.aten.native_dropout.default not in targets


def test_masks_of_an_odd_size_keep_their_bytes(device, small_masks_packed):
    x = torch.randn(4, 33, device=device, requires_grad=True)
    y, saved = _saved(fresh_compile(lambda a: F.dropout(a * 3, 0.5, True)), x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(y != 0, 6.0, 0.0))
    assert (torch.bool, x.numel()) in saved and not any(d == torch.uint8 for d, _ in saved)


def test_small_masks_keep_their_bytes(device):
    x = torch.randn(64, 64, device=device, requires_grad=True)       # under MIN_PACKED_ELEMENTS
    y, saved = _saved(fresh_compile(lambda a: F.dropout(a * 3, 0.5, True)), x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(y != 0, 6.0, 0.0))
    assert (torch.bool, x.numel()) in saved


def test_stacked_dropout_layers_each_keep_their_own_bits(device, small_masks_packed):
    """Repeated layers share one dropout kernel and draw their own masks: each backward reads its own."""
    x = torch.randn(32, 48, device=device, requires_grad=True)
    ws = [torch.randn(48, 48, device=device) / 7 for _ in range(3)]

    def f(a):
        outs = []
        for w in ws:
            a = F.dropout(torch.tanh(a @ w), 0.25, True)
            outs.append(a)
        return outs
    outs, saved = _saved(fresh_compile(f), x)
    sum(o.sum() for o in outs).backward()
    # the same function in eager, with the compiled run's masks read off its outputs
    xe = x.detach().clone().requires_grad_(True)
    a, total = xe, 0
    for w, o in zip(ws, outs):
        a = torch.tanh(a @ w) * (o.detach() != 0) / 0.75
        total = total + a.sum()
    total.backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-5, atol=1e-5)
    assert sum(1 for d, n in saved if d == torch.uint8 and n == 32 * 48 // 8) == 3
