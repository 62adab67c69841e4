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
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (D,), w, b), [(N, D), (D,), (D,)], 3, 6),
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
    # one defined (a kernel's name: its place, the ops it computes; its call sites add _site<N>)
    assert set(re.findall(r"\b(kernel\d+)\w*?(?:_site\d+)?\b", compiled.source)) == {"kernel0"}, \
        compiled.source
    torch.testing.assert_close(compiled(list(args))[0], layers(*args))


def test_repeated_layers_share_kernels_whose_pointers_are_numbered_differently(device):
    """Layer norm + residual layers: each layer's kernel numbers its pointers in another order (the
    residual is a graph input in one, a buffer in the next), yet the middle layers share one kernel,
    called with its arguments in that kernel's order."""
    import re
    from torch.fx.experimental.proxy_tensor import make_fx

    def layers(x, w0, w1, w2, w3, b0, b1, b2, b3):
        for w, b in zip((w0, w1, w2, w3), (b0, b1, b2, b3)):
            x = x + F.gelu(F.layer_norm(x, (D,)) @ w + b)
        return x
    args = [torch.randn(N, D, device=device)] + [torch.randn(D, D, device=device) / 10 for _ in range(4)] + \
        [torch.randn(D, device=device) for _ in range(4)]
    gm = make_fx(layers)(*args)
    compiled = ember.compile_graph(gm, args)
    # first norm, three (residual + next norm) kernels, the last residual
    assert ember.metrics.generated_kernel_count == 5
    assert len(set(re.findall(r"\b(kernel\d+)\w*?(?:_site\d+)?\b", compiled.source))) == 3, compiled.source
    torch.testing.assert_close(compiled(list(args))[0], layers(*args))


def test_groups_of_one_structure_share_a_kernel_and_other_structures_do_not(device):
    """relu(a - 2b) and relu(y - 2c) are one kernel called with other buffers; relu(2y - c) reads the same
    buffers in the other roles and must get a kernel of its own (sharing it would compute y - 2c)."""
    import re
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b, c, w):
        y = torch.relu(a - 2 * b) @ w
        y = torch.relu(y - 2 * c) @ w
        return torch.relu(2 * y - c) @ w
    args = [torch.randn(N, D, device=device) for _ in range(3)] + [torch.randn(D, D, device=device) / 10]
    compiled = ember.compile_graph(make_fx(f)(*args), args)
    assert ember.metrics.generated_kernel_count == 3                         # launched
    assert len(set(re.findall(r"\b(kernel\d+)\w*?(?:_site\d+)?\b", compiled.source))) == 2, compiled.source   # defined
    torch.testing.assert_close(compiled(list(args))[0], f(*args))


def test_tiny_sinks_share_one_kernel(device):
    """In-place updates of many one-element tensors that nothing reads afterwards (an optimizer step's step
    counts) run in one kernel; a tiny output of a large buffer keeps a kernel of its own, since delaying it
    would keep the large buffer alive longer."""
    counts = [torch.randn((), device=device) for _ in range(6)]
    big = torch.randn(512, 512, device=device)

    def fn(counts, big):
        for c in counts:
            c.add_(1.0)
        return big[0, :3] * 3

    expected_counts = [c.clone() for c in counts]
    expected = fn(expected_counts, big)
    with ember.config.patch(combine_kernels=False):      # fusion's count (combined, they are one launch)
        out = ember.testing.fresh_compile(fn)(counts, big)
    ember.testing.assert_close(out, expected)
    ember.testing.assert_close(counts, expected_counts)
    assert ember.metrics.generated_kernel_count == 2, ember.metrics.generated_kernel_count
