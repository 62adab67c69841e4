"""FlexAttention's higher-order ops (`torch.ops.higher_order.flex_attention` and `flex_attention_backward`) as
a KernelCall (ir/kernel_call.py) of kernels the backend writes for the call.

This module checks what it covers, stores the tensor arguments, and describes the call as a
FlexAttentionSpec; the backend's `flex_attention_launches(spec)` (the Triton backend's:
codegen/triton/flex_launch.py) renders score_mod and mask_mod, chooses the blocks and returns the launches.

Covered: static sizes, float32/float16/bfloat16, head dims up to 256 (q/k and v may differ), GQA (query heads
a multiple of the key/value heads), a key/value batch of 1 broadcast over the queries', any sequence
lengths, captured tensors read by the subgraphs; the Triton backend also needs BlockMasks whose sparse block
sizes are multiples of 16. Anything else (a backend without `flex_attention_launches`, such as the C++
backend, symbolic sizes, an op a subgraph uses that the backend cannot render, gradients for captured
tensors) raises Unsupported and runs the ATen op.
"""
from __future__ import annotations

import torch

from .. import metrics, state
from ..device import backend_for
from ..ir.kernel_call import FlexAttentionSpec
from ..ir.nodes import Layout, TensorBox
from .kernel_call import register_call, static_ints, stored_arg
from .registry import Unsupported, lower_higher_order

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def _launches_for(query):
    """The backend's `flex_attention_launches` for query's device; Unsupported where it has none."""
    launches = getattr(backend_for(query.get_device()), "flex_attention_launches", None)
    if launches is None:
        raise Unsupported("flex attention kernels need a backend that writes them")
    return launches


class BlockMaskArgs:
    """The BlockMask tuple as the HOP carries it: (q_len, kv_len, kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, [torch
    >= 2.10: four dq_* orders], SPARSE_Q, SPARSE_KV, mask_mod graph)."""
    NAMES = ("kv_num", "kv_idx", "full_kv_num", "full_kv_idx", "q_num", "q_idx", "full_q_num", "full_q_idx")
    KV_NAMES = NAMES[:4]        # what the forward reads: the key/value blocks of each query block

    def __init__(self, block_mask: tuple):
        self.tensors = dict(zip(self.NAMES, block_mask[2:10]))
        self.sparse_q, self.sparse_kv = static_ints(block_mask[-3:-1])
        self.mask_graph = block_mask[-1]

    def stored(self, names) -> dict:
        return {n: stored_arg(self.tensors[n]) for n in names if self.tensors[n] is not None}


def _captured(values) -> list:
    """The captured tensors as stored TensorBoxes."""
    out = []
    for v in values:
        if not isinstance(v, TensorBox):
            raise Unsupported("flex attention captures a value that is not a tensor")
        out.append(TensorBox(stored_arg(v)))
    return out


def check_shapes(q, k, v) -> tuple:
    (B, Hq, M, D), (Bkv, Hkv, N, Dk), (Bv, Hv, Nv, Dv) = (static_ints(x.get_size()) for x in (q, k, v))
    if q.get_dtype() not in DTYPES or k.get_dtype() != q.get_dtype() or v.get_dtype() != q.get_dtype():
        raise Unsupported("flex attention dtype")
    if Dk != D or (Bv, Hv, Nv) != (Bkv, Hkv, N) or Hq % Hkv or Bkv not in (1, B):
        raise Unsupported("flex attention shapes")
    if max(D, Dv) > MAX_HEAD_DIM or min(B, Hq, M, N, D, Dv) == 0:
        raise Unsupported("flex attention head dim or empty input")
    return B, Hq, M, D, Bkv, Hkv, N, Dv


def register_kernel_call(kind: str, launches_for, spec: FlexAttentionSpec) -> list:
    """The KernelCall of the backend's launches for `spec`, registered with its results: their TensorBoxes."""
    extra_inputs, launches = launches_for(spec)
    device = spec.operands["q"].get_device()
    inputs = [*spec.operands.values(), *spec.block_mask.values(), *extra_inputs]
    metrics.flex_attention_kernels += 1
    return register_call(kind, device, inputs, launches, spec.result_layouts())


def _result_layouts(tensors) -> list[Layout]:
    """The results' layouts, from the node's fake outputs; Unsupported for symbolic strides."""
    layouts = [Layout.from_tensor(t) for t in tensors]
    for layout in layouts:
        static_ints(layout.stride)
    return layouts


def _metas(node, count):
    if node is None:
        return [None] * count
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:count]]


@lower_higher_order(torch.ops.higher_order.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_mod_other_buffers=(), mask_mod_other_buffers=()):
    launches_for = _launches_for(query)
    node = state.current_graph().current_node
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in val):
        raise Unsupported("flex attention without fake outputs")
    sizes = check_shapes(query, key, value)
    Hq, M = sizes[1], sizes[2]
    bm = BlockMaskArgs(block_mask)
    mq, mk, mv = _metas(node, 3)
    operands = {"q": stored_arg(query, mq), "k": stored_arg(key, mk), "v": stored_arg(value, mv)}
    block_mask_tensors = bm.stored(BlockMaskArgs.KV_NAMES)
    score_captured, mask_captured = _captured(score_mod_other_buffers), _captured(mask_mod_other_buffers)
    layouts = _result_layouts(val)
    if static_ints(layouts[1].stride) != [Hq * M, M, 1]:
        raise Unsupported("flex attention logsumexp layout")
    spec = FlexAttentionSpec(
        backward=False, sizes=sizes, dtype=query.get_dtype(), operands=operands, block_mask=block_mask_tensors,
        sparse_q=bm.sparse_q, sparse_kv=bm.sparse_kv, score_mod=score_mod, mask_mod=bm.mask_graph, joint=None,
        score_captured=score_captured, mask_captured=mask_captured, scale=float(scale),
        kernel_options=dict(kernel_options or {}), results=dict(zip(("out", "lse", "max"), layouts)))
    return tuple(register_kernel_call("flex_attention", launches_for, spec))


@lower_higher_order(torch.ops.higher_order.flex_attention_backward)
def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers=(),
                            mask_mod_other_buffers=()):
    launches_for = _launches_for(query)
    node = state.current_graph().current_node
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, (list, tuple)) or len(val) < 3 or grad_out is None or joint_graph is None:
        raise Unsupported("flex attention backward without fake outputs, output gradient or joint graph")
    sizes = check_shapes(query, key, value)
    B, Hq, M, D, Bkv, Hkv, N, Dv = sizes
    if Bkv != B:
        raise Unsupported("flex attention backward with a broadcast key/value batch")
    bm = BlockMaskArgs(block_mask)
    metas = _metas(node, 7)
    stored = {n: stored_arg(x, m) for n, x, m in zip(("q", "k", "v", "out", "lse", "do"),
                                                 (query, key, value, out, logsumexp, grad_out), metas)}
    if grad_logsumexp is not None:
        stored["dlse"] = stored_arg(grad_logsumexp, metas[6])
    block_mask_tensors = bm.stored(BlockMaskArgs.NAMES)
    if "q_num" not in block_mask_tensors or "q_idx" not in block_mask_tensors:
        raise Unsupported("flex attention backward without the BlockMask's q_num_blocks / q_indices")
    score_captured, mask_captured = _captured(score_mod_other_buffers), _captured(mask_mod_other_buffers)
    for n in ("out", "do"):
        if stored[n].layout.size != stored["q"].layout.size[:3] + [Dv]:
            raise Unsupported("flex attention backward output shapes")
    for n in ("lse", "dlse"):
        if n in stored and static_ints(stored[n].layout.stride) != [Hq * M, M, 1]:
            raise Unsupported("flex attention backward logsumexp layout")
    layouts = _result_layouts(val[:3])
    # delta = rowsum(out * dout) - dlse / ln 2, per query row: a float32 result the backward's kernels share
    layouts.append(Layout.contiguous(query.get_device(), torch.float32, [B, Hq, M]))
    operands = {n: stored[n] for n in ("q", "k", "v", "out", "do", "lse", "dlse") if n in stored}
    spec = FlexAttentionSpec(
        backward=True, sizes=sizes, dtype=query.get_dtype(), operands=operands, block_mask=block_mask_tensors,
        sparse_q=bm.sparse_q, sparse_kv=bm.sparse_kv, score_mod=fw_graph, mask_mod=bm.mask_graph,
        joint=joint_graph, score_captured=score_captured, mask_captured=mask_captured, scale=float(scale),
        kernel_options=dict(kernel_options or {}), results=dict(zip(("dq", "dk", "dv", "delta"), layouts)))
    dq, dk, dv, _ = register_kernel_call("flex_attention_backward", launches_for, spec)
    return dq, dk, dv, tuple(None for _ in score_mod_other_buffers)
