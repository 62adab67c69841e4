"""FlexAttention (torch.nn.attention.flex_attention) under ember against eager, forward and backward.

On CUDA and with the Triton backend on the CPU (EMBER_CPU_BACKEND=triton: Triton's interpreter) the HOPs
compile to ember's Triton kernels and no flex op may fall back; with the C++ backend they run as ATen calls.
`test_kernels_under_the_interpreter` runs the kernels whatever the backend. torch refuses flex_attention's
backward on the CPU in its Python API, so the backward kernels are tested on a graph calling the backward
HOP directly, against the HOP's eager (dense) implementation; full training runs on CUDA only.
"""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

import ember
from ember.testing import assert_close, fresh_compile

from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
from torch._higher_order_ops.flex_attention import (create_fw_bw_graph, flex_attention as flex_hop,
                                                    flex_attention_backward as flex_backward_hop)


def _kernels_expected(device) -> bool:
    return device == "cuda" or ember.config.cpu_backend == "triton"


def _check_no_fallback(device):
    if _kernels_expected(device):
        assert not any("flex" in name for name in ember.metrics.fallbacks), dict(ember.metrics.fallbacks)
        assert ember.metrics.flex_attention_kernels >= 1


def _tol(dtype):
    return (2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-4, 2e-5)


def _qkv(device, B=1, H=2, M=37, N=None, D=16, Hkv=None, Dv=None, dtype=torch.float32):
    N, Hkv, Dv = N or M, Hkv or H, Dv or D
    q = torch.randn(B, H, M, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, N, Dv, device=device, dtype=dtype)
    return q, k, v


def _run(device, fn, *args, dtype=torch.float32):
    expected = fn(*args)
    actual = fresh_compile(fn)(*args)
    rtol, atol = _tol(dtype)
    assert_close(actual, expected, rtol=rtol, atol=atol)
    _check_no_fallback(device)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(window):
    def mask(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window
    return mask


def _mask(kind, M, N, device):
    if kind == "none":
        return None
    if kind == "causal":
        fn = causal
    elif kind == "sliding":
        fn = and_masks(causal, sliding(20))
    else:   # documents: each position attends within its own document only, one prefix of the keys
        doc = torch.randint(0, 3, (max(M, N),), device=device).sort().values

        def fn(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]
    return create_block_mask(fn, None, None, M, N, device=device, BLOCK_SIZE=32)


@pytest.mark.parametrize("mask", ["none", "causal", "sliding", "document"])
@pytest.mark.parametrize("S", [1, 37, 64, 200])      # 64: whole sparse blocks, no bounds checks
def test_masks(device, mask, S):
    q, k, v = _qkv(device, M=S)
    bm = _mask(mask, S, S, device)
    _run(device, lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, k, v)


def _score_mods(device, H, S):
    bias = torch.randn(H, S, S, device=device)
    slopes = torch.rand(H, device=device)
    return {
        "relative": lambda score, b, h, q_idx, kv_idx: score + (q_idx - kv_idx) * 0.1,
        "alibi": lambda score, b, h, q_idx, kv_idx: score - slopes[h] * (q_idx - kv_idx).abs(),
        "bias": lambda score, b, h, q_idx, kv_idx: score + bias[h, q_idx, kv_idx],
        "softcap": lambda score, b, h, q_idx, kv_idx: 2.0 * torch.tanh(score / 2.0),
    }


@pytest.mark.parametrize("mod", ["relative", "alibi", "bias", "softcap"])
def test_score_mods(device, mod):
    q, k, v = _qkv(device, M=40)
    score_mod = _score_mods(device, 2, 40)[mod]
    bm = _mask("causal", 40, 40, device)
    _run(device, lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=bm), q, k, v)


def test_gqa_and_lengths_that_differ(device):
    q, k, v = _qkv(device, H=4, Hkv=2, M=37, N=100)
    bm = _mask("document", 37, 100, device)
    _run(device, lambda q, k, v: flex_attention(q, k, v, block_mask=bm, enable_gqa=True), q, k, v)


def test_head_dim_64_returns_lse(device):
    q, k, v = _qkv(device, M=70, D=64)
    bm = _mask("causal", 70, 70, device)
    _run(device, lambda q, k, v: flex_attention(q, k, v, block_mask=bm, return_lse=True), q, k, v)


def test_value_head_dim_differs_and_kernel_options(device):
    q, k, v = _qkv(device, M=50, D=32, Dv=16)
    bm = _mask("sliding", 50, 50, device)
    _run(device, lambda q, k, v: flex_attention(q, k, v, block_mask=bm, kernel_options={"BLOCK_M": 16, "BLOCK_N": 16}),
         q, k, v)


def test_bfloat16(device):
    q, k, v = _qkv(device, M=64, dtype=torch.bfloat16)
    bm = _mask("causal", 64, 64, device)
    score_mod = _score_mods(device, 2, 64)["softcap"]
    _run(device, lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=bm), q, k, v,
         dtype=torch.bfloat16)


def test_kernels_under_the_interpreter(device):
    """The kernels run whatever the CPU backend is: the default (C++) suite tests them too."""
    if device != "cpu":
        pytest.skip("the CPU's Triton interpreter")
    q, k, v = _qkv(device, M=37)
    bm = _mask("causal", 37, 37, device)
    with ember.config.patch(cpu_backend="triton"):
        _run(device, lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, k, v)
        assert ember.metrics.flex_attention_kernels == 1


def test_head_dims_above_256_run_as_the_aten_op_on_a_gpu(device, monkeypatch):
    """GPU launch shapes stop at head dim 256. The test asks the kernels as a GPU backend would (not
    interpreted) and checks the call runs the ATen op."""
    if device != "cpu":
        pytest.skip("the CPU's Triton interpreter, asked as a GPU backend")
    from ember.codegen.triton import backend as triton_backend, flex_launch
    monkeypatch.setattr(triton_backend.TritonBackend, "flex_attention_launches",
                        lambda self, spec: flex_launch.flex_attention_launches(spec, interpreted=False))
    q, k, v = _qkv(device, M=20, D=512)
    with ember.config.patch(cpu_backend="triton"):
        fn = lambda q, k, v: flex_attention(q, k, v)      # noqa: E731
        assert_close(fresh_compile(fn)(q, k, v), fn(q, k, v), rtol=1e-4, atol=2e-5)
    assert ember.metrics.fallbacks["flex_attention"] == 1 and ember.metrics.flex_attention_kernels == 0


def test_launch_config():
    """Launch shapes come from FLEX_CONFIGS by kernel, GPU and head dim; kernel_options override them per
    kernel (torch's names); blocks shrink to divide the BlockMask's sparse blocks."""
    from ember.codegen.triton.flex_attention import FLEX_CONFIGS, FlexConfig, FlexProblem, launch_config

    def problem(D, dtype=torch.bfloat16, sparse=128, S=4096):
        return FlexProblem(1, 1, S, D, 1, 1, S, D, dtype, 1.0, {}, sparse, sparse, {}, False, None, None, [])
    assert launch_config(problem(128), "forward", {}, (9, 0)) == FLEX_CONFIGS[("forward", "sm90", 128)]
    assert launch_config(problem(64), "dkdv", {}, (9, 0)) == FLEX_CONFIGS[("dkdv", "sm90", 64)]
    assert launch_config(problem(100), "dkdv", {}, (9, 0)) == FLEX_CONFIGS[("dkdv", "sm90", 128)]
    assert launch_config(problem(64, torch.float32), "dq", {}, (9, 0)) == FLEX_CONFIGS[("dq", "fp32", 256)]
    assert launch_config(problem(64), "forward", {}, None) == FlexConfig(32, 32, 1, 1)
    options = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_M1": 16, "num_warps": 2, "num_stages": 1}
    assert launch_config(problem(64), "forward", options, (9, 0)) == FlexConfig(64, 32, 2, 1)
    assert launch_config(problem(64), "dkdv", options, (9, 0)) == FlexConfig(16, 32, 2, 1)
    assert launch_config(problem(64), "dq", {"BLOCK_M2": 32}, (8, 0)).block_m == 32
    # sparse blocks of 32: no block larger than 32
    assert launch_config(problem(64, sparse=32), "forward", {}, (9, 0)).block_m == 32


def test_subgraph_ember_cannot_render_falls_back(device):
    """A score_mod with an op ember has no lowering for runs the ATen HOP: right, if not fast."""
    q, k, v = _qkv(device, M=20)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + torch.special.bessel_j0(score)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod)
    expected = fn(q, k, v)
    assert_close(fresh_compile(fn)(q, k, v), expected, rtol=1e-4, atol=2e-5)
    assert ember.metrics.fallbacks["flex_attention"] == 1


# -- backward -------------------------------------------------------------------------------------------------

def _backward_graph(q, k, v, score_mod, bm, bufs, scale):
    example = (q.new_zeros((), requires_grad=True), *[q.new_zeros((), dtype=torch.int) for _ in range(4)])
    with TransformGetItemToIndex():      # as Dynamo traces a score_mod: tensor[idx] with 0-d tensors
        fw, joint = create_fw_bw_graph(score_mod, example, bufs)
    out, lse, *_ = flex_hop(q, k, v, fw, bm.as_tuple(), scale, {}, bufs, ())
    dout = torch.randn_like(out)

    def backward(q, k, v, out, lse, dout):
        return flex_backward_hop(q, k, v, out, lse, dout, None, fw, joint, bm.as_tuple(), scale, {}, bufs, ())
    return backward, [q, k, v, out, lse, dout]


def _backward_mods(device, H, S):
    """Score mods and the tensors they read, passed as the HOP's score_mod_other_buffers."""
    return {
        "identity": (lambda score, b, h, q_idx, kv_idx: score, ()),
        "softcap": (_score_mods(device, H, S)["softcap"], ()),
        "bias": (lambda score, b, h, q_idx, kv_idx, bias: score + bias[h, q_idx, kv_idx],
                 (torch.randn(H, S, S, device=device),)),
        "alibi": (lambda score, b, h, q_idx, kv_idx, slopes: score - slopes[h] * (q_idx - kv_idx).abs(),
                  (torch.rand(H, device=device),)),
    }


@pytest.mark.parametrize("case", ["identity_causal", "softcap_sliding", "bias_gqa", "alibi_document",
                                  "softcap_causal_64", "identity_document_96"])
def test_backward_hop(device, case):
    """Lengths 64 and 96 are whole sparse blocks (32): the kernels leave their bounds checks out."""
    mod, mask, *length = case.split("_")
    gqa = mask == "gqa"
    M = int(length[0]) if length else 45
    q, k, v = _qkv(device, H=4 if gqa else 2, Hkv=2, M=M, D=16)
    score_mod, bufs = _backward_mods(device, q.shape[1], M)[mod]
    bm = _mask("causal" if gqa else mask, M, M, device)
    fn, inputs = _backward_graph(q, k, v, score_mod, bm, bufs, 0.3)
    expected = fn(*inputs)
    gm = make_fx(fn)(*inputs)
    actual = ember.compile_graph(gm, inputs)(list(inputs))
    assert_close(list(actual[:3]), list(expected[:3]), rtol=1e-4, atol=5e-5)
    _check_no_fallback(device)


def test_training(device):
    if device != "cuda":
        pytest.skip("torch runs flex_attention's backward on CUDA only")
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (t.requires_grad_(True) for t in _qkv(device, H=4, Hkv=2, M=300, D=64, dtype=dtype))
        bm = _mask("sliding", 300, 300, device)
        score_mod = _score_mods(device, 4, 300)["softcap"]

        def step(q, k, v):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
        dout = torch.randn(1, 4, 300, 64, device=device, dtype=dtype)
        ref = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        expected = step(*ref)
        expected.backward(dout)
        ember.metrics.reset()
        actual = fresh_compile(step)(q, k, v)
        actual.backward(dout)
        rtol, atol = _tol(dtype)
        assert_close(actual, expected, rtol=rtol, atol=atol)
        for a, e in zip((q, k, v), ref):
            assert_close(a.grad, e.grad, rtol=rtol, atol=atol * 2, what="grad")
        assert ember.metrics.flex_attention_kernels >= 2
        _check_no_fallback(device)
