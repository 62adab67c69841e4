"""Hand-written attention, `softmax(q @ k^T * scale [+ mask]) [dropout] @ v`, is rewritten to the fused
scaled-dot-product attention kernel (graph/passes/attention.py) in inference graphs and in the joint
training graph, and matches eager, outputs and gradients; forms the fused kernel would compute differently
are left alone."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.operator_schemas import normalize_function

import ember
from ember.graph.decompose import FUSED_ATTENTION
from ember.testing import check

aten = torch.ops.aten
B, H, L, D = 2, 4, 8, 16
MIN = torch.finfo(torch.float32).min


@pytest.fixture
def graphs():
    """Every graph ember lowers (after its post-grad passes), as its call_function nodes."""
    seen = []
    with ember.config.patch(post_grad_passes=[lambda gm: seen.append(
            [n for n in gm.graph.nodes if n.op == "call_function"])]):
        yield seen


def attention_calls(graphs) -> list:
    """The fused attention forward calls, each as {argument name: value (a tensor argument's fake value)}."""
    calls = []
    for g in graphs:
        for n in g:
            if getattr(n.target, "overloadpacket", None) in FUSED_ATTENTION and "backward" not in str(n.target):
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
                calls.append(normalize_function(n.target, args, kwargs, normalize_to_only_use_kwargs=True).kwargs)
    return calls


def assert_rewritten(graphs, training: bool, count: int = 1):
    assert ember.metrics.attention_rewrites == count, "the attention was not rewritten"
    targets = [n.target for g in graphs for n in g]
    assert aten.bmm.default not in targets, "a batched matmul is left"
    fused = [t for t in targets if getattr(t, "overloadpacket", None) in FUSED_ATTENTION]
    assert len(fused) == count * (2 if training else 1), fused
    # an inference call with few queries per key/value head runs as ember's own kernel instead
    ours = ember.metrics.short_attention_kernels
    assert all(str(t) in ember.metrics.fallbacks for t in fused) or not training and ours == len(fused), \
        "the fused kernel ran neither as an ATen call nor as ember's kernel"


def assert_not_rewritten(graphs):
    assert ember.metrics.attention_rewrites == 0
    assert aten.bmm.default in [n.target for g in graphs for n in g]


def rand(*shape, device, dtype=torch.float32):
    return torch.randn(*shape, device=device, dtype=dtype)


def keep_mask(*shape, device):
    """A random boolean mask that keeps the first key of every row (a row of masked keys only is a NaN in
    eager's softmax)."""
    m = torch.rand(*shape, device=device) > 0.4
    m[..., 0] = True
    return m


def scores(q, k, scale=None):
    return q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))


def rep_interleave(x, n):
    return x.repeat_interleave(n, dim=1)


def rep_expand(x, n):
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def variant(name: str, device):
    """(fn, args, compile kwargs) of one hand-written form; masks are read from the enclosing scope (they
    take no gradient)."""
    q, k, v = (rand(B, H, L, D, device=device) for _ in range(3))
    if name == "mul":
        return lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v, (q, k, v)
    if name == "div":
        return lambda q, k, v: F.softmax(q @ k.transpose(2, 3) / math.sqrt(D), -1) @ v, (q, k, v)
    if name == "additive_mask":                  # BERT's padding mask: 0 or a large negative, added
        m = torch.where(keep_mask(B, 1, 1, L, device=device), 0.0, -10000.0) + rand(B, 1, 1, L, device=device)
        return lambda q, k, v: torch.softmax(scores(q, k) + m, -1) @ v, (q, k, v)
    if name == "mask_first":                     # a full-size bias added before the scores
        m = rand(B, H, L, L, device=device)
        return lambda q, k, v: torch.softmax(m + scores(q, k), -1) @ v, (q, k, v)
    if name == "bool_mask":
        m = keep_mask(B, 1, L, L, device=device)
        return lambda q, k, v: torch.softmax(scores(q, k).masked_fill(~m, float("-inf")), -1) @ v, (q, k, v)
    if name == "where_min":
        m = keep_mask(L, L, device=device)
        return lambda q, k, v: torch.softmax(torch.where(m, scores(q, k), MIN), -1) @ v, (q, k, v)
    if name == "float_mask":                     # a 0/1 float mask turned into masked scores
        m = keep_mask(B, 1, 1, L, device=device).float()
        return lambda q, k, v: torch.softmax(scores(q, k).masked_fill(m == 0, float("-inf")), -1) @ v, (q, k, v)
    if name == "causal_tril":
        def causal(q, k, v):
            keep = torch.tril(torch.ones(L, L, dtype=torch.bool, device=q.device))
            return torch.softmax(scores(q, k).masked_fill(~keep, float("-inf")), -1) @ v
        return causal, (q, k, v)
    if name == "gpt2":                           # GPT-2: causal where with finfo.min, then the padding mask
        keep = torch.tril(torch.ones(L, L, dtype=torch.bool, device=device))[None, None]
        pad = torch.where(keep_mask(B, 1, 1, L, device=device), 0.0, MIN)
        return lambda q, k, v: torch.softmax(torch.where(keep, scores(q, k), MIN) + pad, -1) @ v, (q, k, v)
    if name in ("gqa_repeat_interleave", "gqa_expand"):
        repeat = rep_interleave if name == "gqa_repeat_interleave" else rep_expand
        k, v = rand(B, 2, L, D, device=device), rand(B, 2, L, D, device=device)
        return lambda q, k, v: torch.softmax(scores(q, repeat(k, 2)), -1) @ repeat(v, 2), (q, k, v)
    if name == "autocast":                       # Llama: float32 softmax under autocast, cast back
        m = rand(1, 1, L, L, device=device)

        def llama(q, k, v):
            with torch.autocast(device_type=q.device.type, dtype=torch.bfloat16):
                w = q @ k.transpose(2, 3) * D ** -0.5 + m
                w = F.softmax(w, dim=-1, dtype=torch.float32).to(torch.bfloat16)
                return (w @ v).float()
        return llama, (q, k, v)
    if name == "bf16":
        m = rand(B, 1, 1, L, device=device, dtype=torch.bfloat16)
        return lambda q, k, v: torch.softmax(scores(q, k) + m, -1) @ v, tuple(x.bfloat16() for x in (q, k, v))
    raise KeyError(name)


VARIANTS = ["mul", "div", "additive_mask", "mask_first", "bool_mask", "where_min", "float_mask", "causal_tril", "gpt2",
            "gqa_repeat_interleave", "gqa_expand", "autocast", "bf16"]


def tolerances(name):
    return dict(rtol=2e-2, atol=2e-2) if name in ("autocast", "bf16") else {}


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("name", VARIANTS)
def test_hand_written_attention_is_rewritten(name, training, device, graphs):
    fn, args = variant(name, device)
    with torch.set_grad_enabled(training):
        check(fn, *args, grad=training, **tolerances(name))
    assert_rewritten(graphs, training)
    (call,) = attention_calls(graphs)
    if name == "causal_tril":                    # a constant lower triangle is SDPA's own causal mask
        assert call["is_causal"] and call.get("attn_mask") is None
    if name.startswith("gqa") and not training and device == "cpu":
        assert call["key"].shape[1] == 2, "k and v were not passed unrepeated with enable_gqa"


class SelfAttention(torch.nn.Module):
    """Projections, heads split by view + transpose (inputs with the strides models give them), a padding
    mask, heads merged and projected back."""

    def __init__(self, dim=H * D):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D) + mask, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, s, H * D))


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_model_attention_with_projections(training, device, graphs):
    model = SelfAttention().to(device)
    x = rand(B, L, H * D, device=device)
    mask = torch.where(keep_mask(B, 1, 1, L, device=device), 0.0, MIN)
    compiled = torch.compile(model, backend="ember")
    with torch.set_grad_enabled(training):
        out = compiled(x, mask)
        expected = model(x, mask)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        if training:
            g = torch.randn_like(out)
            params = list(model.parameters())
            torch.testing.assert_close(torch.autograd.grad(out, params, g), torch.autograd.grad(expected, params, g),
                                       rtol=1e-4, atol=1e-5)
    assert_rewritten(graphs, training)


SEQ = 12          # with dynamic=True a size of its own, not one of B, H or D


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_rewritten_with_dynamic_sizes(training, device, graphs):
    if training and device == "cuda":
        pytest.xfail("fails on an H100 with torch 2.11 (a rewritten float-mask attention, symbolic sizes, "
                     "training); not yet diagnosed")
    # a constant scale (one computed from a symbolic size is a graph value, not a number SDPA takes)
    m = rand(B, 1, 1, SEQ, device=device)
    fn = lambda q, k, v: torch.softmax(scores(q, k, scale=0.25) + m, -1) @ v  # noqa: E731
    with torch.set_grad_enabled(training):
        check(fn, *(rand(B, H, SEQ, D, device=device) for _ in range(3)), grad=training, dynamic=True)
    assert_rewritten(graphs, training)


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_causal_mask_with_dynamic_sizes(training, device, graphs):
    """triu(ones(s, s), 1) of a symbolic s is read as SDPA's causal mask: no mask tensor is made."""
    def fn(q, k, v):
        s = q.shape[2]
        drop = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        return torch.softmax(scores(q, k, scale=0.25).masked_fill(drop, float("-inf")), -1) @ v
    with torch.set_grad_enabled(training):
        check(fn, *(rand(B, H, SEQ, D, device=device) for _ in range(3)), grad=training, dynamic=True)
    assert_rewritten(graphs, training)
    (call,) = attention_calls(graphs)
    assert call["is_causal"] and call.get("attn_mask") is None


def test_dropout_in_training(device, graphs):
    """Dropout becomes SDPA's dropout where a fused kernel takes it (a GPU; the CPU's flash kernel has none,
    so there the hand-written form stays). The kept entries are random either way, so the test compares
    the average over a batch of identical problems with the output without dropout."""
    n = 512
    q, k, v = (rand(1, H, L, D, device=device).expand(n, H, L, D).contiguous().requires_grad_() for _ in range(3))
    fn = lambda q, k, v: F.dropout(torch.softmax(scores(q, k), -1), 0.25, training=True) @ v  # noqa: E731
    out = torch.compile(fn, backend="ember")(q, k, v)
    out.sum().backward()
    assert q.grad.isfinite().all() and k.grad.isfinite().all() and v.grad.isfinite().all()
    with torch.no_grad():
        expected = torch.softmax(scores(q[:1], k[:1]), -1)[0] @ v[0]
    out = out.detach()
    mean, sem = out.mean(0), out.std(0) / math.sqrt(n)
    assert ((mean - expected).abs() <= 5 * sem + 1e-3).float().mean() > 0.99
    if device == "cuda":
        assert_rewritten(graphs, training=True)
        (call,) = attention_calls(graphs)
        assert call["dropout_p"] == 0.25
    else:
        assert_not_rewritten(graphs)


def _not_fused_cases(device):
    q, k, v = (rand(B, H, L, D, device=device) for _ in range(3))
    m = keep_mask(B, 1, L, L, device=device)
    return {
        # a small fill differs from a mask where a row has every key masked
        "small_fill": lambda q, k, v: torch.softmax(scores(q, k).masked_fill(~m, -1e4), -1) @ v,
        # a negative scale would turn -inf masks into +inf
        "negative_scale": lambda q, k, v: torch.softmax(scores(q, k, scale=-0.25), -1) @ v,
        # the weights are returned too: the fused kernel does not make them
        "weights_returned": lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(scores(q, k), -1)),
        # softmax over the queries, not the keys
        "softmax_over_queries": lambda q, k, v: torch.softmax(scores(q, k), -2) @ v,
    }, (q, k, v)


@pytest.mark.parametrize("name", ["small_fill", "negative_scale", "weights_returned", "softmax_over_queries"])
def test_other_forms_are_left_alone(name, device, graphs):
    cases, args = _not_fused_cases(device)
    check(cases[name], *args, grad=True)
    assert_not_rewritten(graphs)


def _sin_twice(x):
    return torch.sin(x) * 2


def test_a_joint_pattern_finds_a_forward_with_its_backward(device):
    """Pattern(trace="joint") traces a function with its backward, as AOTAutograd's joint graph has them;
    a pattern without a replacement only finds (what the attention pass builds on)."""
    from ember.graph.pattern import Pattern
    pattern = Pattern(_sin_twice, None, [torch.randn(4)], trace="joint")
    found = []

    def find(gm):
        found.extend(pattern.matches(gm))
        with pytest.raises(ValueError, match="no replacement"):
            pattern.apply(gm)
    with ember.config.patch(joint_passes=[find]):
        check(lambda x, y: _sin_twice(x) + y.cos(), rand(8, device=device), rand(8, device=device), grad=True)
    (m,) = found
    assert [n.target for n in m.outputs] == [aten.mul.Tensor] * 2       # sin(x) * 2 and the gradient of x
    assert aten.cos.default in [n.target for n in m.nodes.values()]   # the backward of sin is in the match
    assert m["x"].op == "placeholder" and m["tangent_0"].op == "placeholder"
