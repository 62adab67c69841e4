"""The foundation's acceptance checks: kernel counts for fused patterns and an MLP trained with ember."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import MLP, check


def test_pointwise_chain_is_one_kernel(device):
    x, y = torch.randn(33, 17, device=device), torch.randn(33, 17, device=device)
    check(lambda a, b: (a * b + 1).sin().relu(), x, y)
    assert ember.metrics.generated_kernel_count == 1


@pytest.mark.parametrize("n", [7, 256, 1000, 4096])
def test_softmax_is_one_kernel(device, n):
    check(lambda a: torch.softmax(a, -1), torch.randn(6, n, device=device))
    assert ember.metrics.generated_kernel_count == 1


@pytest.mark.parametrize("n", [7, 256, 1000, 4096])
def test_layer_norm_is_one_kernel(device, n):
    x, w, b = torch.randn(5, n, device=device), torch.randn(n, device=device), torch.randn(n, device=device)
    check(lambda a, w_, b_: F.layer_norm(a, (n,), w_, b_), x, w, b)
    assert ember.metrics.generated_kernel_count == 1


def test_looped_softmax_is_one_kernel(device):
    check(lambda a: torch.softmax(a, -1), torch.randn(2, 20000, device=device))  # rows beyond persistent_reduction_max
    assert ember.metrics.generated_kernel_count == 1


def test_mlp_training_matches_eager(device):
    torch.manual_seed(0)
    eager = MLP().to(device)
    model = MLP().to(device)
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="ember")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x, t = torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device)
        le, lc = eager(x, t), compiled(x, t)
        torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
        le.backward()
        lc.backward()
        for pe, pc in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-5)
        for opt in (opt_e, opt_c):
            opt.step()
            opt.zero_grad()
    assert ember.metrics.eager_fallbacks == 0
    assert ember.metrics.graphs_compiled == 2
