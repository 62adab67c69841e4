"""Characteristic graphs compile to the kernels and buffers a hand-written implementation would use:
counted here (forward + backward), and checked against eager, outputs and gradients."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import check

N, D = 32, 100


def rmsnorm_residual(x, r, w):
    h = x + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = {
    # name: (fn, input shapes, kernels fwd+bwd, buffers fwd+bwd)
    # softmax: one kernel each way; the backward needs only the saved output
    "softmax": (lambda x: torch.softmax(x, -1), [(N, D)], 2, 2),
    # layer norm: forward one kernel (out, mean, rstd); backward one row kernel (grad x) and one column
    # kernel (grad weight and grad bias together)
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (D,), w, b), [(N, D), (D,), (D,)], 3, 7),
    "rmsnorm_residual": (rmsnorm_residual, [(N, D), (N, D), (D,)], 3, 5),
    # GELU + bias + residual: forward one kernel; backward grad x (pointwise) and grad bias (column sum)
    "gelu_bias_residual": (lambda x, b, r: F.gelu(x + b) + r, [(N, D), (D,), (N, D)], 3, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_and_buffer_counts(name, device):
    fn, shapes, kernels, buffers = CASES[name]
    args = [torch.randn(*s, device=device) for s in shapes]
    check(fn, *args, grad=True)
    assert ember.metrics.generated_kernel_count == kernels
    assert ember.metrics.buffers_allocated == buffers
    assert not ember.metrics.fallbacks


def test_kernel_counts_do_not_depend_on_row_length(device):
    """Long rows (a looped reduction) fuse the same way as short ones (a persistent one)."""
    x = torch.randn(4, 3000, device=device)
    with ember.config.patch(persistent_reduction_max=1024):
        check(lambda x: torch.softmax(x, -1), x, grad=True)
    assert ember.metrics.generated_kernel_count == 2


def test_repeated_layers_share_their_kernels(device):
    """Kernels whose source is the same but for the name (the same layer, repeated) are defined
    (compiled, tuned, loaded) once and launched once per layer, with the right results."""
    import re
    from torch.fx.experimental.proxy_tensor import make_fx

    def layers(x, w0, w1, w2, w3):
        for w in (w0, w1, w2, w3):
            x = F.gelu(x @ w) * 2         # the matmul (ATen) ends each layer's kernel
        return x
    args = [torch.randn(N, D, device=device)] + [torch.randn(D, D, device=device) / 10 for _ in range(4)]
    gm = make_fx(layers)(*args)
    compiled = ember.compile_graph(gm, args)
    assert ember.metrics.generated_kernel_count == 4                     # one per layer, launched
    assert set(re.findall(r"\bkernel\d+\b", compiled.source)) == {"kernel0"}, compiled.source  # one defined
    torch.testing.assert_close(compiled(list(args))[0], layers(*args))
