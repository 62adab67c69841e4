"""Random ops as ember kernels (ember/lowering/random.py). Values cannot match eager's (another
generator), so these tests check what must hold instead: the distribution on fresh calls, that
`torch.manual_seed` reproduces a run, that calls and ops draw different numbers, that dropout's
backward uses its forward's mask, that the C++ and Triton backends draw identical numbers for one seed,
and that nothing runs as an ATen fallback."""
import math

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import default_tol, fresh_compile

N = 1 << 14          # small enough for the Triton interpreter, large enough for 5-sigma checks


def lowered(fn, *args):
    """fn compiled with ember and called once; asserts that no op ran as an ATen fallback."""
    out = fresh_compile(fn)(*args)
    assert not ember.metrics.fallbacks, f"unexpected ATen fallbacks: {dict(ember.metrics.fallbacks)}"
    assert ember.metrics.eager_fallbacks == 0
    return out


def assert_mean_var(x, mean, var, sigmas=5.0):
    """Sample mean and variance of x within `sigmas` standard errors (for the 4th moment of a uniform or
    a normal, whichever `var` says it is)."""
    x = x.double().flatten()
    n = x.numel()
    m4 = 3 * var * var if var != 1 / 12 else 1 / 80
    assert abs(x.mean().item() - mean) < sigmas * math.sqrt(var / n), x.mean().item()
    assert abs(x.var().item() - var) < sigmas * math.sqrt((m4 - var * var) / n), x.var().item()


def assert_fraction(mask, p, sigmas=5.0):
    frac = mask.double().mean().item()
    assert abs(frac - p) < sigmas * math.sqrt(p * (1 - p) / mask.numel()) + 1e-12, (frac, p)


# --- distributions ----------------------------------------------------------------------------------------

def test_rand(device):
    u = lowered(lambda x: torch.rand(N, device=x.device) + x, torch.zeros(1, device=device))
    assert u.dtype == torch.float32 and u.shape == (N,)
    assert u.min() >= 0 and u.max() < 1
    assert_mean_var(u, 0.5, 1 / 12)
    assert u.unique().numel() > N * 0.99


def test_randn(device):
    z = lowered(lambda x: torch.randn(64, N // 64, device=x.device) * x, torch.ones(1, device=device))
    assert z.shape == (64, N // 64)
    assert_mean_var(z, 0.0, 1.0)
    assert z.isfinite().all() and z.abs().max() < 7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_rand_like_dtypes(device, dtype):
    x = torch.empty(N // 4, 4, dtype=dtype, device=device)
    u, z = lowered(lambda a: (torch.rand_like(a), torch.randn_like(a)), x)
    assert u.dtype == z.dtype == dtype and u.shape == z.shape == x.shape
    # a float32 uniform rounded to a narrow float could reach 1.0
    assert u.min() >= 0 and u.max() < 1
    assert_mean_var(u, 0.5, 1 / 12, sigmas=6)
    assert_mean_var(z, 0.0, 1.0, sigmas=6)


def test_rand_like_of_a_transposed_input(device):
    x = torch.randn(96, 128, device=device).t()
    u = lowered(lambda a: torch.rand_like(a) + a * 0, x)
    assert u.shape == x.shape and u.min() >= 0 and u.max() < 1
    assert_mean_var(u, 0.5, 1 / 12)


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 1.0])
def test_bernoulli_p(device, p):
    x = torch.randn(N, device=device)
    b = lowered(lambda a: torch.bernoulli(a, p), x)
    assert b.dtype == x.dtype and set(b.unique().tolist()) <= {0.0, 1.0}
    assert_fraction(b, p)


def test_bernoulli_tensor_p(device):
    probs = torch.tensor([0.1, 0.5, 0.9, 0.0], device=device)
    x = torch.empty(N // 4, 4, device=device)
    b = lowered(lambda a, p: a.bernoulli_(p), x, probs)
    for j, p in enumerate(probs.tolist()):
        assert_fraction(b[:, j], p)


def test_bernoulli_of_probabilities(device):
    """torch.bernoulli(p) decomposes into rand < p."""
    p = torch.rand(N, device=device)
    b = lowered(lambda q: torch.bernoulli(q), p)
    assert_fraction(b, p.mean().item(), sigmas=6)
    assert b[p < 0.05].mean() < 0.2 and b[p > 0.95].mean() > 0.8


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_native_dropout(device, p):
    x = torch.randn(N, device=device)
    out, mask = lowered(lambda a: torch.ops.aten.native_dropout(a, p, True), x)
    assert mask.dtype == torch.bool
    assert_fraction(mask, 1 - p)
    # exactly eager's arithmetic on kept elements, zero elsewhere
    assert torch.equal(out, torch.where(mask, x * (1.0 / (1.0 - p)), torch.zeros_like(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dropout_module(device, dtype):
    x = torch.randn(8, N // 8, device=device, dtype=dtype)
    drop = torch.nn.Dropout(0.3)
    out = lowered(lambda a: drop(a * 2) + 1, x)
    kept = out != 1
    assert_fraction(kept, 0.7)
    # kernels keep float16 intermediates in float32: within the float16 tolerance of eager's math
    rtol, atol = default_tol(dtype)
    torch.testing.assert_close(out[kept], ((x * 2) / 0.7 + 1)[kept], rtol=rtol, atol=atol)


def test_dropout_edge_probabilities(device):
    x = torch.randn(64, device=device)
    out0, out1 = lowered(lambda a: (F.dropout(a, 0.0, True), F.dropout(a, 1.0, True)), x)
    assert torch.equal(out0, x) and not out1.any()
    drop = torch.nn.Dropout(0.5).eval()
    assert torch.equal(lowered(lambda a: drop(a) * 2, x), x * 2)


def test_uniform_and_normal_in_place(device):
    x = torch.empty(N, device=device)
    u, z = lowered(lambda a: (a.clone().uniform_(-2, 4), a.clone().normal_(3, 0.5)), x)
    assert u.min() >= -2 and u.max() < 4
    assert_mean_var(u, 1.0, 36 / 12)
    assert_mean_var(z, 3.0, 0.25)


def test_randint(device):
    a, b, c = lowered(lambda x: (torch.randint(-3, 5, (N,), device=x.device), torch.randint(7, (N,), device=x.device),
                                 torch.randint_like(x, 10, 20)), torch.empty(N, device=device))
    assert a.dtype == b.dtype == torch.int64 and c.dtype == torch.float32
    assert a.min() == -3 and a.max() == 4 and b.min() == 0 and b.max() == 6
    assert c.min() == 10 and c.max() == 19 and torch.equal(c, c.round())
    counts = torch.bincount(a + 3, minlength=8).double()
    assert (counts - N / 8).abs().max() < 5 * math.sqrt(N / 8)


def test_randint_wide_range(device):
    r = lowered(lambda x: torch.randint(0, 2 ** 62, (4096,), device=x.device) + x, torch.zeros(1, dtype=torch.int64,
                                                                                            device=device))
    assert r.min() >= 0 and r.max() < 2 ** 62 and r.max() > 2 ** 61
    assert r.unique().numel() == r.numel()


# --- seeds: reproducible, fresh per call, distinct per op ---------------------------------------------------

def _draws(a):
    return (torch.rand_like(a), torch.randn(5, 7, device=a.device), F.dropout(a, 0.5, True),
            torch.randint(0, 1000, (33,), device=a.device))


def test_manual_seed_reproduces_and_calls_differ(device):
    x = torch.randn(256, device=device)
    fn = fresh_compile(_draws)
    torch.manual_seed(123)
    first, second = fn(x), fn(x)
    torch.manual_seed(123)
    again = fn(x)
    for a, b, c in zip(first, second, again):
        assert torch.equal(a, c)
        assert not torch.equal(a, b)
    assert not ember.metrics.fallbacks, dict(ember.metrics.fallbacks)


def test_two_random_ops_in_one_graph_differ(device):
    a, b, c = lowered(lambda x: (torch.rand_like(x), torch.rand_like(x), torch.rand(x.shape, device=x.device)),
                      torch.empty(1024, device=device))
    assert not torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(b, c)
    assert (a == b).float().mean() < 0.01


def test_consumers_of_one_random_value_agree(device):
    """A random value inlined into several consumers (kernels or fused) is the same number in each."""
    def fn(x):
        r = torch.rand_like(x)
        return r + 1, (r * 2).sum(-1), r.t().contiguous() * x.t()
    x = torch.randn(48, 40, device=device)
    plus, rowsum, prod = lowered(fn, x)
    r = plus - 1
    torch.testing.assert_close(rowsum, (r * 2).sum(-1))
    torch.testing.assert_close(prod, (r * x).t())


def test_dynamic_shapes(device):
    fn = fresh_compile(lambda a: F.dropout(a, 0.25, True) + torch.rand_like(a), dynamic=True)
    for n in (300, 517):
        x = torch.randn(n, device=device)
        out = fn(x)
        assert out.shape == (n,)
    assert not ember.metrics.fallbacks and ember.metrics.eager_fallbacks == 0


# --- training: the backward sees the forward's mask ---------------------------------------------------------

def test_dropout_backward_uses_forward_mask(device):
    p = 0.4
    x = torch.randn(32, N // 32, device=device, requires_grad=True)
    fn = fresh_compile(lambda a: F.dropout(a.sin(), p, True))
    y = fn(x)
    g = torch.randn_like(y)
    y.backward(g)
    kept = y != 0
    assert_fraction(kept, 1 - p)
    expected = torch.where(kept, g * (1.0 / (1 - p)) * x.detach().cos(), torch.zeros_like(g))
    torch.testing.assert_close(x.grad, expected)
    assert not ember.metrics.fallbacks and ember.metrics.eager_fallbacks == 0


def test_random_value_saved_for_backward(device):
    """y = x * rand: d/dx is the same rand, never a fresh draw in the backward graph."""
    x = torch.randn(4096, device=device).abs().add(0.5).requires_grad_(True)
    fn = fresh_compile(lambda a: a * torch.rand_like(a) + torch.bernoulli(a.sigmoid()) * a)
    y = fn(x)
    y.sum().backward()
    b = torch.where(x.grad >= 1, 1.0, 0.0)       # the bernoulli term's d/dx is its 0/1 draw
    r = x.grad - b
    torch.testing.assert_close(y, x.detach() * r + b * x.detach())
    assert not ember.metrics.fallbacks and ember.metrics.eager_fallbacks == 0


def test_inference_graph_dropout(device):
    x = torch.randn(N, device=device)
    with torch.no_grad():
        out = lowered(lambda a: F.dropout(a, 0.5, True), x)
    assert_fraction(out != 0, 0.5)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_bits_are_independent_keep_flags(device, p):
    """ember::dropout_bits (a dropout's keep flags eight to a byte, two Philox draws per byte): each bit
    position is kept with probability 1 - p, adjacent elements (within a byte, across bytes and across the
    two draws of a byte) are independent, calls differ and manual_seed repeats them."""
    fn = fresh_compile(lambda d: torch.ops.ember.dropout_bits(N, p, d))
    torch.manual_seed(3)
    packed = fn(torch.device(device))
    assert not ember.metrics.fallbacks and packed.dtype == torch.uint8 and packed.shape == (N,)
    bits = ((packed.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8, device=device)) & 1).bool().flatten()
    q = 1 - p
    for j in range(8):
        assert_fraction(bits[j::8], q)
    for lag in (1, 3, 4, 8):                    # neighbours, the two draws of a byte, the next byte
        assert_fraction(bits[:-lag] & bits[lag:], q * q)
    torch.manual_seed(3)
    assert torch.equal(fn(torch.device(device)), packed)
    assert not torch.equal(fn(torch.device(device)), packed)


# --- the two CPU backends draw the same numbers ---------------------------------------------------------------

def test_cpp_and_triton_backends_agree(device):
    if device != "cpu":
        pytest.skip("compares the two CPU backends")
    x = torch.randn(16, 33)

    def fn(a):
        out, mask = torch.ops.aten.native_dropout(a, 0.3, True)
        return (out, mask, torch.ops.ember.dropout_bits(300, 0.3, a.device),
                torch.rand(3, 50, dtype=torch.float16), torch.randint(-5, 1000, (33,)),
                torch.bernoulli(a, 0.4), torch.randint(3, 2 ** 40, (5,)), torch.randn(7, 9), a.sum() + torch.rand(()))

    results = {}
    for backend in ("cpp", "triton"):
        with ember.config.patch(cpu_backend=backend):
            torch.manual_seed(7)
            results[backend] = lowered(fn, x)
    *exact, normal, scalar = zip(results["cpp"], results["triton"])
    for a, b in exact:
        assert torch.equal(a, b)
    # Box-Muller's log and cos may round differently in libm and numpy
    torch.testing.assert_close(normal[0], normal[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(scalar[0], scalar[1])


# --- repeated layers: one kernel, a seed each ---------------------------------------------------------------

def test_repeated_dropout_layers_share_a_kernel_and_draw_their_own_masks(device):
    """Layers that differ only in which seed their dropout reads are one kernel on a backend that passes the
    seed's position at launch (KernelBackend.element_arguments), launched with each layer's position: the
    masks differ between layers, and each layer's output is its input through its own mask."""
    import re
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember.device import backend_for
    p = 0.3

    def layers(x, w0, w1, w2, w3):
        outs = []
        for w in (w0, w1, w2, w3):
            h = torch.relu(x @ w)
            x, keep = torch.ops.aten.native_dropout(h, p, True)
            outs += [h, x, keep]
        return outs
    args = [torch.randn(64, 96, device=device)] + [torch.randn(96, 96, device=device) / 10 for _ in range(4)]
    compiled = ember.compile_graph(make_fx(layers)(*args), args)
    outs = compiled(list(args))
    defined = set(re.findall(r"\b(kernel\d+)\w*?(?:_site\d+)?\b", compiled.source))
    assert ember.metrics.generated_kernel_count == 4
    # the first three layers share one kernel (the last numbers its pointers another way: its input is a
    # graph output)
    assert len(defined) == (2 if backend_for(args[0].device).element_arguments else 4), compiled.source
    masks = []
    for h, x, keep in zip(outs[0::3], outs[1::3], outs[2::3]):
        assert_fraction(keep, 1 - p)
        torch.testing.assert_close(x, torch.where(keep, h / (1 - p), torch.zeros_like(h)))
        masks.append(keep)
    for i in range(4):
        for j in range(i):
            assert not torch.equal(masks[i], masks[j]), (i, j)
