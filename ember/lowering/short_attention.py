"""Fused scaled-dot-product attention forwards with few query rows per key/value head (a decoding step) as a
KernelCall of kernels the backend writes (`short_query_attention_launches`; the Triton backend's:
codegen/triton/short_attention.py), instead of the library kernel eager picked.

SDPA reaches ember's graphs as the fused op torch chose for the inputs (`_scaled_dot_product_cudnn_attention`,
`_efficient_attention`, `_flash_attention`, `_flash_attention_for_cpu`). Their kernels tile the queries of
each head, and with one query per head most of the tile is empty: on an H100 cuDNN's kernel took 7.5 us for
a decoding step's attention over 200 keys. Covered: inference (only the output is read: no logsumexp for
a backward), no dropout, static sizes, float32/float16/bfloat16, query heads a multiple of the key/value
heads (GQA) with at most MAX_ROWS query rows per key/value head, head dims up to 256, an additive or boolean
mask broadcast over batch, heads or queries, and `is_causal`. Anything else, or
`ember.config.short_query_attention = False`, raises Unsupported and runs the ATen op.
"""
from __future__ import annotations

import math
import operator

import torch

from .. import metrics, state
from ..config import config
from ..device import backend_for
from ..ir.kernel_call import ShortQueryAttentionSpec
from ..ir.nodes import Layout
from .kernel_call import register_call, static_ints, stored_arg
from .registry import Unsupported, lower

aten = torch.ops.aten

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_ROWS = 64            # query heads per key/value head times queries: one tile of the kernel
MAX_HEAD_DIM = 256


def _broadcast_strides(x, dims: int = 4) -> list[int]:
    """x's strides right-aligned to `dims` dimensions, 0 along a dimension of size 1 or missing."""
    size, stride = static_ints(x.layout.size), static_ints(x.layout.stride)
    pad = [0] * (dims - len(size))
    return pad + [0 if n == 1 else s for n, s in zip(size, stride)]


def _only_output_read(node) -> bool:
    """Whether the node's results other than the attention output (logsumexp, seeds) are read by nothing."""
    for u in node.users:
        if u.op != "call_function" or u.target is not operator.getitem:
            return False
        if u.args[1] != 0 and u.users:
            return False
    return True


def _short_attention(query, key, value, bias, dropout_p, is_causal, scale):
    backend = backend_for(query.get_device())
    launches_for = backend.short_query_attention_launches if config.short_query_attention else None
    graph = state.current_graph()
    node = graph.current_node
    val = node.meta.get("val") if node is not None else None
    if launches_for is None or not isinstance(val, (list, tuple)) or not isinstance(val[0], torch.Tensor):
        raise Unsupported("short-query attention needs a backend that writes its kernels")
    if dropout_p or not _only_output_read(node):
        raise Unsupported("short-query attention with dropout, or whose logsumexp is read (training)")
    (B, Hq, M, D), (Bk, Hkv, N, Dk), (Bv, Hv, Nv, Dv) = (static_ints(x.get_size()) for x in (query, key, value))
    dtype = query.get_dtype()
    if dtype not in DTYPES or key.get_dtype() != dtype or value.get_dtype() != dtype:
        raise Unsupported("short-query attention dtype")
    if Dk != D or (Bv, Hv, Nv) != (Bk, Hkv, N) or Hq % Hkv or Bk not in (1, B) or min(B, Hq, M, N, D, Dv) == 0:
        raise Unsupported("short-query attention shapes")
    if Hq // Hkv * M > MAX_ROWS or max(D, Dv) > MAX_HEAD_DIM:
        raise Unsupported("attention with many queries per key/value head: the library's kernel tiles them")
    metas = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3]]
    operands = {n: stored_arg(x, m) for n, x, m in zip(("q", "k", "v"), (query, key, value), metas)}
    mask = "none"
    if bias is not None:
        operands["bias"] = stored_arg(bias)
        size = static_ints(operands["bias"].layout.size)
        if len(size) > 4 or [1] * (4 - len(size)) + size not in _bias_sizes(B, Hq, M, N):
            raise Unsupported("short-query attention mask shape")
        mask = "boolean" if bias.get_dtype() == torch.bool else "additive"
    out = Layout.from_tensor(val[0])
    static_ints(out.stride)
    strides = {n: _broadcast_strides(x) for n, x in operands.items()}
    strides["out"] = static_ints(out.stride)
    spec = ShortQueryAttentionSpec((B, Hq, M, D, Hkv, N, Dv), dtype, operands, strides, mask, bool(is_causal),
                                   float(scale) if scale is not None else 1.0 / math.sqrt(D), out)
    scratch, launches = launches_for(spec)
    layouts = [out] + [Layout.contiguous(query.get_device(), dt, size) for dt, size in scratch]
    metrics.short_attention_kernels += 1
    result = register_call("short_query_attention", query.get_device(), list(operands.values()), launches, layouts)
    return (result[0],) + (None,) * (len(val) - 1)


def _bias_sizes(B, Hq, M, N) -> list:
    """The 4-D sizes a mask may have: each of batch, heads and queries either full or broadcast."""
    return [[b, h, m, N] for b in {1, B} for h in {1, Hq} for m in {1, M}]


@lower(aten._scaled_dot_product_cudnn_attention.default)
def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    return _short_attention(query, key, value, attn_bias, dropout_p, is_causal, scale)


@lower(aten._scaled_dot_product_efficient_attention.default)
def efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                        scale=None):
    return _short_attention(query, key, value, attn_bias, dropout_p, is_causal, scale)


@lower(aten._scaled_dot_product_flash_attention.default)
def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    return _short_attention(query, key, value, None, dropout_p, is_causal, scale)


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return _short_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
