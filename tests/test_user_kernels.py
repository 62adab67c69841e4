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


@triton.jit
def add_tiles_kernel(x_desc, y_desc, out_desc, BM: tl.constexpr, BN: tl.constexpr):
    """out = x + y, tile by tile through host-side tensor descriptors (TMA loads and stores on sm90)."""
    m, n = tl.program_id(0) * BM, tl.program_id(1) * BN
    out_desc.store([m, n], x_desc.load([m, n]) + y_desc.load([m, n]))


def _fn_with_descriptors(x, y):
    from triton.tools.tensor_descriptor import TensorDescriptor
    a, out = x * 2, torch.empty_like(x)
    bm, bn = 32, 64
    descs = [TensorDescriptor.from_tensor(t, [bm, bn]) for t in (a, y, out)]
    add_tiles_kernel[(triton.cdiv(x.shape[0], bm), triton.cdiv(x.shape[1], bn))](*descs, BM=bm, BN=bn)
    return (out.relu() + 1).sum(0)


@pytest.mark.parametrize("wrapper", ["python", "fx"])
def test_user_kernel_with_tensor_descriptors(device, wrapper):
    """A user kernel taking host-side TensorDescriptors (Dynamo records them in the wrapper op's
    tma_descriptor_metadata) runs inside the compiled graph, through both wrapper renderers; the product of
    sizes that are not multiples of the block checks the descriptors' bounds."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("host-side tensor descriptors need a GPU of compute capability 9.0 or later")
    x, y = torch.randn(100, 200, device=device), torch.randn(100, 200, device=device)
    with ember.config.patch(wrapper=wrapper):
        check(_fn_with_descriptors, x, y)
    assert ember.metrics.eager_fallbacks == 0
