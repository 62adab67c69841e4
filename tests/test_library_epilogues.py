"""A matmul's bias and ReLU / tanh-GELU applied by the GEMM library's epilogue (`aten._addmm_activation`,
graph/passes/library_epilogues.py): where it applies, where it must not, and results against eager's and a
float64 reference. On a CPU the backend's library fuses nothing, so the tests say it does (ATen's CPU op
computes the same function as two ops); on CUDA cuBLASLt runs it."""
import math

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.device import backend_for
from ember.testing import check

aten = torch.ops.aten


@pytest.fixture
def library_fuses(device, monkeypatch):
    monkeypatch.setattr(backend_for(device), "library_bias_activations", frozenset({"relu", "gelu_tanh"}))
    monkeypatch.setattr(backend_for(device), "matmul_alignment", 16)      # a GPU's (padding only large products)


def _new_gelu(y):            # Hugging Face's gelu_new (GPT-2), written out
    return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


ACTIVATIONS = {"relu": torch.relu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "gelu_new": _new_gelu}


def _ops(fn, *args, grad=False, **tolerance):
    seen = []
    with ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        check(fn, *args, grad=grad, **tolerance)
    return seen


def _linear_inputs(device, dtype, m=64, k=96, n=128):
    return (torch.randn(m, k, device=device, dtype=dtype) / 4, torch.randn(n, k, device=device, dtype=dtype) / 4,
            torch.randn(n, device=device, dtype=dtype))


@pytest.mark.usefixtures("library_fuses")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_a_bias_and_activation_run_in_the_library_call(device, dtype, act):
    """act(linear(x, w, b)) in inference: one `_addmm_activation`, no addmm; the result within the dtype's
    tolerance of eager's and no farther from a float64 reference than eager's (1.5x: the library applies
    the activation to the float32 accumulator, eager to the rounded product)."""
    x, w, b = _linear_inputs(device, dtype)
    fn = lambda x, w, b: ACTIVATIONS[act](F.linear(x, w, b))
    with torch.no_grad():
        seen = _ops(fn, x, w, b, rtol=2e-2, atol=2e-2)
        out = torch.compile(fn, backend="ember")(x, w, b)
        ref = fn(*(t.double() for t in (x, w, b)))
        eager_err = (fn(x, w, b).double() - ref).norm()
    assert aten._addmm_activation.default in seen and aten.addmm.default not in seen
    assert (out.double() - ref).norm() <= 1.5 * eager_err + 1e-6


@pytest.mark.usefixtures("library_fuses")
def test_gpt2_style_mlp_through_reshapes(device):
    """Hugging Face's Conv1D: addmm over the flattened rows, a reshape back, gelu_new, then the next
    product (not pointwise): the first product fuses its activation; the second, whose result is returned,
    stays an addmm."""
    dtype = torch.bfloat16
    x = torch.randn(2, 24, 64, device=device, dtype=dtype) / 4
    w1, b1 = torch.randn(64, 256, device=device, dtype=dtype) / 8, torch.randn(256, device=device, dtype=dtype)
    w2, b2 = torch.randn(256, 64, device=device, dtype=dtype) / 8, torch.randn(64, device=device, dtype=dtype)

    def mlp(x, w1, b1, w2, b2):
        h = torch.addmm(b1, x.view(-1, 64), w1).view(2, 24, 256)
        h = _new_gelu(h)
        return torch.addmm(b2, h.view(-1, 256), w2).view(2, 24, 64)
    with torch.no_grad():
        seen = _ops(mlp, x, w1, b1, w2, b2, rtol=2e-2, atol=2e-2)
    assert seen.count(aten._addmm_activation.default) == 1 and seen.count(aten.addmm.default) == 1


@pytest.mark.usefixtures("library_fuses")
@pytest.mark.parametrize("case", ["pre_activation_returned", "pointwise_reader", "exact_gelu", "float32",
                                  "k_misaligned", "training"])
def test_where_the_library_epilogue_does_not_apply(device, case):
    """The product stays an addmm (its bias and activation in ember's kernel) where its value is read
    elsewhere (returned; saved for the backward), where a pointwise op reads the activation (its kernel makes
    the pass over the product anyway), for exact GELU (the library's is tanh-GELU), float32, and K off the
    matmul alignment."""
    # training in float16: bf16 gradients summed over 64 rows differ by more than the case is about
    dtype = {"float32": torch.float32, "training": torch.float16}.get(case, torch.bfloat16)
    x, w, b = _linear_inputs(device, dtype, k=95 if case == "k_misaligned" else 96)
    gelu = lambda y: F.gelu(y) if case == "exact_gelu" else F.gelu(y, approximate="tanh")

    def fn(x, w, b):
        y = F.linear(x, w, b)
        if case == "pre_activation_returned":
            return gelu(y), y
        if case == "pointwise_reader":
            return gelu(y) * 2.0
        return gelu(y)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    if case == "training":
        for t in (x, w, b):
            t.requires_grad_(True)
        seen = _ops(fn, x, w, b, grad=True, **tol)
    else:
        with torch.no_grad():
            seen = _ops(fn, x, w, b, **tol)
    assert aten._addmm_activation.default not in seen


def test_no_library_epilogue_where_the_backend_has_none(device, monkeypatch):
    monkeypatch.setattr(backend_for(device), "library_bias_activations", frozenset())
    x, w, b = _linear_inputs(device, torch.bfloat16)
    with torch.no_grad():
        seen = _ops(lambda x, w, b: torch.relu(F.linear(x, w, b)), x, w, b, rtol=2e-2, atol=2e-2)
    assert aten._addmm_activation.default not in seen
