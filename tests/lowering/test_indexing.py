"""Indexing by tensors (gather, index_select, embedding, advanced indexing) lowered to indirect loads."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import check


def test_gather(device):
    x = torch.randn(8, 50, device=device)
    check(lambda a, i: torch.gather(a, 1, i) * 2, x, torch.randint(0, 50, (8, 3), device=device))
    assert not ember.metrics.fallbacks


def test_gather_dim0_grad(device):
    x = torch.randn(6, 5, device=device)
    check(lambda a, i: torch.gather(a, 0, i).sin(), x, torch.randint(0, 6, (4, 5), device=device), grad=True)


def test_embedding_and_grad(device):
    w = torch.randn(20, 6, device=device)
    check(lambda w_, i: F.embedding(i, w_) + 1, w, torch.randint(0, 20, (3, 4), device=device), grad=True)


def test_index_select(device):
    x = torch.randn(8, 50, device=device)
    check(lambda a, i: a.index_select(1, i).sum(0), x, torch.randint(0, 50, (7,), device=device))


@pytest.mark.parametrize("case", ["adjacent", "separated", "negative", "sliced"])
def test_advanced_indexing(device, case):
    x = torch.randn(4, 5, 6, device=device)
    i, j = torch.randint(0, 4, (3,), device=device), torch.randint(0, 6, (3,), device=device)
    fn = {"adjacent": lambda a, p, q: a[p, q % 5],
          "separated": lambda a, p, q: a[p, :, q],
          "negative": lambda a, p, q: a[:, -1 - (p % 5)],
          "sliced": lambda a, p, q: a[p, 1:, q] * 2}[case]
    check(fn, x, i, j)
    assert "aten.index.Tensor" not in ember.metrics.fallbacks


def test_cross_entropy_has_no_fallback(device):
    x, t = torch.randn(8, 50, device=device), torch.randint(0, 50, (8,), device=device)
    check(lambda a, b: F.cross_entropy(a, b), x, t, grad=True)
    assert "aten.gather.default" not in ember.metrics.fallbacks
