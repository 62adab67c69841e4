"""User-defined @triton.jit kernels called inside a compiled function stay kernel calls (Dynamo captures
them as a higher-order op; ember runs it from the wrapper). Dynamo captures Triton kernels only where
Triton has a GPU backend, so these run on the GPU machine (EMBER_TEST_DEVICE=cuda)."""
import pytest
import torch

import ember
from ember.testing import check

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Adds two vectors.

    The docstring holds \"\"\"triple quotes\"\"\" on purpose: kernel sources with them must survive.
    """
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, m) + tl.load(y_ptr + offs, m), m)


def _fn(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 64),)](x * 2, y, out, x.numel(), BLOCK=64)
    return (out.relu() + 1).sum(0)


def test_user_triton_kernel_runs_inside_the_compiled_graph(device):
    if device != "cuda":
        pytest.skip("Dynamo traces user Triton kernels only with a GPU Triton backend")
    x, y = torch.randn(100, 3, device=device), torch.randn(100, 3, device=device)
    check(_fn, x, y)
    assert ember.metrics.eager_fallbacks == 0
    assert ember.metrics.generated_kernel_count >= 1
