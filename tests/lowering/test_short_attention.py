"""Attention with few queries per key/value head (a decoding step) under ember against eager: SDPA's fused
op runs as ember's kernels (lowering/short_attention.py, codegen/triton/short_attention.py) on CUDA and with
the Triton backend on the CPU (EMBER_CPU_BACKEND=triton); with the C++ backend it stays the ATen op."""
from __future__ import annotations

import pytest
import torch

import ember
from ember.testing import assert_close, eager_fuses_sdpa, fresh_compile

F = torch.nn.functional


def _kernels_expected(device) -> bool:
    return device == "cuda" or ember.config.cpu_backend == "triton"


def _tol(dtype):
    return (2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-4, 1e-5)


def _run(device, fn, *args, dtype=torch.float32, kernels=True):
    """fn compiled against eager under no_grad; `kernels`: ember's kernels must run (True), must not (False),
    or eager runs no fused kernel at all (None)."""
    with torch.no_grad():
        expected = fn(*args)
        actual = fresh_compile(fn)(*args)
    rtol, atol = _tol(dtype)
    assert_close(actual, expected, rtol=rtol, atol=atol)
    used = ember.metrics.short_attention_kernels
    if kernels is None:         # eager runs the math form: so does ember
        return
    if kernels and _kernels_expected(device):
        assert used >= 1 and not any("scaled_dot_product" in op for op in ember.metrics.fallbacks), \
            dict(ember.metrics.fallbacks)
    elif not kernels:
        assert used == 0


def _qkv(device, B, Hq, Hkv, M, N, D, dtype):
    q = torch.randn(B, Hq, M, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_with_grouped_heads_and_a_boolean_mask(device, dtype):
    """One query per head, four query heads per key/value head, a cache's keys kept by a boolean mask
    (a row of a causal mask, as a decoder with a static cache passes it)."""
    q, k, v = _qkv(device, 1, 8, 2, 1, 37, 64, dtype)
    keep = torch.arange(37, device=device) <= 29

    def step(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[None, None, None], enable_gqa=True)
    _run(device, step, q, k, v, keep, dtype=dtype,
         kernels=eager_fuses_sdpa(q, k, v, attn_mask=keep[None, None, None], enable_gqa=True) or None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_mask_per_batch_over_keys_walked_in_splits(device, dtype):
    """Three queries, an additive mask per batch entry, 300 keys: several programs per key/value head walk
    them, and a second kernel combines their partial results."""
    q, k, v = _qkv(device, 2, 4, 2, 3, 300, 40, dtype)
    bias = torch.randn(2, 1, 3, 300, device=device, dtype=dtype)
    _run(device, lambda q, k, v, bias: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True),
         q, k, v, bias, dtype=dtype, kernels=eager_fuses_sdpa(q, k, v, attn_mask=bias, enable_gqa=True) or None)


def test_causal_with_fewer_queries_than_keys(device):
    """is_causal with 2 queries over 9 keys: query i sees keys 0..i, as eager's mask aligns them."""
    q, k, v = _qkv(device, 1, 2, 2, 2, 9, 16, torch.float32)
    _run(device, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


def test_scale_given(device):
    q, k, v = _qkv(device, 2, 3, 3, 1, 21, 32, torch.float32)
    _run(device, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), q, k, v)


def test_many_queries_keep_the_library_kernel(device):
    """A prefill (65 queries of one head per key/value head) is the library kernel's case: not lowered."""
    q, k, v = _qkv(device, 1, 2, 2, 65, 65, 16, torch.float32)
    _run(device, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, kernels=False)


def test_training_keeps_the_library_kernel(device):
    """With gradients the forward's logsumexp is saved for the backward: the fused op and its backward run,
    gradients as eager's."""
    q, k, v = (t.requires_grad_() for t in _qkv(device, 1, 4, 2, 1, 24, 16, torch.float32))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sin().sum()
    f(q, k, v).backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fresh_compile(f)(q, k, v).backward()
    assert_close([t.grad for t in (q, k, v)], expected, rtol=1e-4, atol=1e-5)
    assert ember.metrics.short_attention_kernels == 0


def test_keys_are_split_only_where_programs_are_few():
    """On a GPU up to 256 keys are one program's; more are split in chunks of 128 until the launch has about
    128 programs."""
    from ember.codegen.triton.short_attention import plan
    from ember.ir.kernel_call import ShortQueryAttentionSpec

    def splits(B, Hkv, N):
        spec = ShortQueryAttentionSpec((B, 4 * Hkv, 1, 64, Hkv, N, 64), torch.bfloat16, {}, {}, "none", False,
                                       0.125, None)
        return plan(spec, interpreted=False).splits
    assert splits(1, 4, 208) == 1 and splits(1, 4, 256) == 1 and splits(1, 4, 300) == 3
    assert splits(1, 4, 1024) == 8 and splits(8, 8, 1024) == 2 and splits(64, 8, 1024) == 1


def test_long_caches_stay_with_the_library_on_a_gpu():
    """Over more than GPU_MAX_KEYS keys the library's kernel was faster: the backend declines the call."""
    from ember.codegen.triton.short_attention import GPU_MAX_KEYS, launches
    from ember.ir.kernel_call import ShortQueryAttentionSpec
    from ember.lowering.registry import Unsupported
    spec = ShortQueryAttentionSpec((1, 16, 1, 64, 4, GPU_MAX_KEYS + 1, 64), torch.bfloat16, {}, {}, "none", False,
                                   0.125, None)
    with pytest.raises(Unsupported):
        launches(spec, interpreted=False)


def test_the_same_call_in_every_layer_is_one_kernel(device):
    """A decoder's layers make the same attention call over caches of one layout: one kernel is defined (and
    compiled) and launched once per layer."""
    q, k1, v1 = _qkv(device, 1, 4, 2, 1, 29, 16, torch.float32)
    k2, v2 = torch.randn_like(k1), torch.randn_like(v1)

    def two_layers(q, k1, v1, k2, v2):
        o = F.scaled_dot_product_attention(q, k1, v1, enable_gqa=True)
        return F.scaled_dot_product_attention(o * 2, k2, v2, enable_gqa=True)
    _run(device, two_layers, q, k1, v1, k2, v2, kernels=eager_fuses_sdpa(q, k1, v1, enable_gqa=True) or None)
    if _kernels_expected(device) and ember.metrics.short_attention_kernels:
        assert ember.metrics.short_attention_kernels == 2 and ember.metrics.generated_kernel_count <= 2
