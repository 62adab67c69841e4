"""Attention: F.scaled_dot_product_attention stays one fused ATen kernel (forward and backward), and
hand-written attention is rewritten to it (graph/passes/attention.py). Each test compiles with ember,
checks the graphs ember lowers (post-grad: a fused attention kernel run as an extern, no bmm) and compares
outputs and gradients with eager. EMBER_TEST_DEVICE=cuda runs them on a GPU, where the fused kernels are
flash, memory-efficient or cuDNN attention."""
import math

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.graph.decompose import FUSED_ATTENTION, decomposition_table
from ember.testing import check, eager_fuses_sdpa

aten = torch.ops.aten
B, H, L, D = 2, 4, 8, 16


@pytest.fixture
def graphs():
    """The ATen ops of every graph ember lowers (after its post-grad passes), one list per graph."""
    seen = []
    record = lambda gm: seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])  # noqa: E731
    with ember.config.patch(post_grad_passes=[record]):
        yield seen


def fused_ops(graphs) -> list:
    return [t for g in graphs for t in g if getattr(t, "overloadpacket", None) in FUSED_ATTENTION]


def assert_fused(graphs, training: bool):
    ops = fused_ops(graphs)
    assert ops, f"no fused attention kernel in the graphs ember lowered: {graphs}"
    assert not any(t is aten.bmm.default for g in graphs for t in g), "attention ran as batched matmuls"
    assert any("backward" in str(t) for t in ops) == training, ops
    externs = set(ember.metrics.fallbacks)
    # an inference call with few queries per key/value head runs as ember's own fused kernels instead
    # (lowering/short_attention.py)
    ours = ember.metrics.short_attention_kernels
    assert all(str(t) in externs for t in ops) or not training and ours == len(ops), \
        f"{ops} did not run as ATen calls ({externs}) nor as ember's kernels ({ours})"


def rand(*shape, device, dtype=torch.float32):
    return torch.randn(*shape, device=device, dtype=dtype)


def qkv(device, dtype=torch.float32, kv_heads=H):
    return rand(B, H, L, D, device=device, dtype=dtype), rand(B, kv_heads, L, D, device=device, dtype=dtype), \
        rand(B, kv_heads, L, D, device=device, dtype=dtype)


# -- item 1: SDPA is never decomposed -------------------------------------------------------------------------

def test_fused_kernels_are_not_in_the_decomposition_table():
    table = decomposition_table()
    kept = [op for op in table if op.overloadpacket in FUSED_ATTENTION]
    assert not kept, f"ember would decompose {kept}"
    # the CUDA kernels and their backwards are among those kept whole
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"):
        for suffix in ("", "_backward"):
            assert getattr(aten, name + suffix) in FUSED_ATTENTION


def _sdpa_case(case: str, device):
    """(fn, args); a mask is read from the enclosing scope, so that it takes no gradient (eager runs the math
    form for a mask that does, on every device)."""
    q, k, v = qkv(device, kv_heads=2 if case == "gqa" else H)
    if case == "bool_mask":
        m = torch.rand(L, L, device=device) > 0.3
        m[:, 0] = True
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), (q, k, v)
    if case == "float_mask":
        m = rand(B, 1, L, L, device=device)
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), (q, k, v)
    if case == "causal":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)
    if case == "gqa":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)), (q, k, v)
    if case == "scale":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3)), (q, k, v)
    raise KeyError(case)


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("case", ["bool_mask", "float_mask", "causal", "gqa", "scale"])
def test_sdpa_stays_fused(case, training, device, graphs):
    fn, args = _sdpa_case(case, device)
    with torch.set_grad_enabled(training):
        check(fn, *args, grad=training)
    # on a GPU, eager itself runs GQA in the math form when no fused kernel takes it: ember does the same
    if case != "gqa" or eager_fuses_sdpa(*args, enable_gqa=True):
        assert_fused(graphs, training)


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool", "float"])
def test_sdpa_mask_broadcast_over_keys_stays_fused(dtype, training, device, graphs):
    """A mask broadcast along the key dimension (Hugging Face's padding mask under torch.compile: strides
    (0, L, 1, 0)) sends SDPA to its math form on CUDA; ember makes it contiguous first
    (graph/passes/sdpa_mask.py)."""
    per_query = torch.ones(L, device=device, dtype=torch.bool) if dtype is torch.bool else rand(L, device=device)
    m = per_query.view(1, 1, L, 1).expand(B, 1, L, L)
    assert m.stride(-1) == 0
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.125)  # noqa: E731
    with torch.set_grad_enabled(training):
        check(fn, *qkv(device), grad=training)
    assert ember.metrics.sdpa_mask_copies == 1
    assert_fused(graphs, training)


def _mask_from_constants(kind: str, device):
    """A mask built inside the graph from no input, as a model called without a padding mask builds one."""
    def make():
        if kind == "ones":              # keeps every key: Hugging Face's mask when attention_mask is None
            keep = torch.ones(B, L, device=device)
            return (keep[:, None, None, :] > 0.5).expand(B, 1, L, L)
        if kind == "zeros_additive":
            return torch.zeros(B, 1, L, L, device=device)
        if kind == "padded":            # the last key masked out: must stay
            keep = torch.ones(B, L, device=device)
            keep[:, -1] = 0
            return (keep[:, None, None, :] > 0.5).expand(B, 1, L, L)
        if kind == "random":            # true with near certainty, but not known: must stay
            return torch.rand(B, 1, L, L, device=device) < 2.0
        raise KeyError(kind)
    return make


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("kind,dropped", [("ones", True), ("zeros_additive", True), ("padded", False),
                                          ("random", False)])
def test_sdpa_mask_from_constants_that_keeps_everything_is_dropped(kind, dropped, training, device, graphs):
    make = _mask_from_constants(kind, device)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=make())  # noqa: E731
    with torch.set_grad_enabled(training):
        check(fn, *qkv(device), grad=training)
    assert ember.metrics.sdpa_masks_dropped == int(dropped)
    assert_fused(graphs, training)


def test_sdpa_mask_that_depends_on_an_input_is_kept(device):
    def fn(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(keep[:, None, None, :] > 0.5))
    check(fn, *qkv(device), torch.ones(B, L, device=device))
    assert ember.metrics.sdpa_masks_dropped == 0


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_sdpa_stays_fused_with_dynamic_sizes(training, device, graphs):
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.set_grad_enabled(training):
        check(fn, *(rand(B, H, 12, D, device=device) for _ in range(3)), grad=training, dynamic=True)
    assert_fused(graphs, training)


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_sdpa_stays_fused_under_autocast(training, device, graphs):
    def fn(q, k, v):
        with torch.autocast(device_type=q.device.type, dtype=torch.bfloat16):
            return F.scaled_dot_product_attention(q, k, v).float()
    with torch.set_grad_enabled(training):
        check(fn, *qkv(device), grad=training, rtol=2e-2, atol=2e-2)
    assert_fused(graphs, training)


def _batch_mean_is_expected(out: torch.Tensor, expected: torch.Tensor):
    """Dropout's output averaged over a batch of identical problems is the output without dropout, within
    the sampling error of the average (5 standard errors of the batch's own spread)."""
    mean, sem = out.mean(0), out.std(0) / math.sqrt(out.shape[0])
    assert out.isfinite().all()
    assert ((mean - expected).abs() <= 5 * sem + 1e-3).float().mean() > 0.99


def test_sdpa_dropout_in_training(device, graphs):
    """Eager picks the fused kernel with dropout only on a GPU (the CPU's flash kernel has none): ember keeps
    that kernel there, and runs the math form on the CPU as eager does. On the GPU the fused kernel draws its
    mask from torch's generator as eager's call does, so the same seed gives the same output."""
    n = 512
    q, k, v = (rand(1, H, L, D, device=device).expand(n, H, L, D).contiguous().requires_grad_() for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)  # noqa: E731
    compiled = torch.compile(fn, backend="ember")
    torch.manual_seed(1)
    out = compiled(q, k, v)
    out.sum().backward()
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(q[:1], k[:1], v[:1])[0]
    _batch_mean_is_expected(out.detach(), expected)
    if device == "cuda":
        assert_fused(graphs, training=True)
        torch.manual_seed(1)
        torch.testing.assert_close(out, fn(q, k, v), rtol=0, atol=0)
    else:
        assert not fused_ops(graphs)


def test_extern_outputs_with_ints_through_both_wrappers(graphs):
    """A fused attention kernel returns ints besides tensors (max sequence lengths on a GPU), which its
    backward reads: an extern's int outputs reach the ops that read them, in the Python and FX wrappers."""
    lib = torch.library.Library("ember_test_attention", "FRAGMENT")
    lib.define("rows_and_count(Tensor x) -> (Tensor, Tensor, SymInt)")
    lib.define("scaled_by(Tensor x, SymInt n) -> Tensor")
    lib.impl("rows_and_count", lambda x: (x.sum(-1), x.amax(-1), x.shape[-1]), "CompositeExplicitAutograd")
    lib.impl("scaled_by", lambda x, n: x * n, "CompositeExplicitAutograd")
    torch.library.register_fake("ember_test_attention::rows_and_count", lambda x: (
        x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1]), x.shape[-1]), lib=lib)
    torch.library.register_fake("ember_test_attention::scaled_by", lambda x, n: torch.empty_like(x), lib=lib)
    ops = torch.ops.ember_test_attention

    def fn(x):
        total, top, n = ops.rows_and_count(x)
        return ops.scaled_by(total - top, n) + 1
    for wrapper in ("python", "fx"):
        with ember.config.patch(wrapper=wrapper):
            check(fn, torch.randn(4, 6))
            check(fn, torch.randn(5, 7), dynamic=True)
    assert ember.metrics.fallbacks["ember_test_attention.rows_and_count.default"] == 4
