"""Peak memory of compiled programs, against eager's on the same inputs: memory planning must not keep
dead buffers alive (a view made for an ATen call once held its whole base until the graph returned)."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import assert_close, peak_bytes


@pytest.fixture(autouse=True)
def _measurable(device):
    if device == "cpu" and ember.config.cpu_backend == "triton":
        pytest.skip("Triton's interpreter copies every kernel argument, so its peak says nothing")


class Attention(torch.nn.Module):
    """Fused qkv projection split into views for SDPA, as GPT-2 and BERT do."""

    def __init__(self, d=256, heads=4):
        super().__init__()
        self.h = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(B, T, D))


def _model(device, layers=6):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Attention() for _ in range(layers)]).to(device)


def test_inference_peak_not_above_eager(device):
    model = _model(device).eval()
    x = torch.randn(8, 256, 256, device=device)
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        expected, got = model(x), compiled(x)
        assert_close(got, expected)
        eager_peak = peak_bytes(lambda: model(x))
        ember_peak = peak_bytes(lambda: compiled(x))
    # every layer's qkv (6 MiB here) kept alive would add 30 MiB to eager's ~10 MiB
    assert ember_peak <= 1.1 * eager_peak + (1 << 20), (ember_peak / 2**20, eager_peak / 2**20)


def test_training_step_peak_not_above_eager(device, request):
    if ember.config.wrapper == "fx":
        # the GraphModule takes its inputs positionally (as out-of-tree backends expect), so every saved
        # activation the backward reads stays alive until it returns (wrapper/fx.py BoxedCall): ~20% above
        # eager here (34 vs 28 MiB)
        request.applymarker(pytest.mark.xfail(reason="FX wrapper keeps its inputs alive", strict=False))
    model = _model(device, layers=4)
    compiled_model = _model(device, layers=4)
    compiled = torch.compile(compiled_model, backend="ember")
    x = torch.randn(8, 128, 256, device=device)

    def step(m):
        def run():
            m.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
        return run
    step(compiled)()                        # compile outside the measurement
    step(model)()
    eager_peak = peak_bytes(step(model))
    ember_peak = peak_bytes(step(compiled))
    for (n, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        assert_close(q.grad, p.grad, what=n)
    assert ember_peak <= 1.1 * eager_peak + (1 << 20), (ember_peak / 2**20, eager_peak / 2**20)
