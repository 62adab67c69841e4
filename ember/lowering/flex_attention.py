"""FlexAttention's higher-order ops (`torch.ops.higher_order.flex_attention` and `flex_attention_backward`) as
ember Triton kernels: a KernelCall (ir/kernel_call.py) whose kernels codegen/triton/flex_attention*.py write,
with score_mod and mask_mod lowered by ember's own lowering table and rendered inline
(codegen/triton/flex_subgraph.py).

Covered: static sizes, float32/float16/bfloat16, head dims up to 256 (q/k and v may differ), GQA (query heads
a multiple of the key/value heads), a key/value batch of 1 broadcast over the queries', any sequence
lengths, BlockMasks whose sparse block sizes are multiples of 16, captured tensors read by the subgraphs.
Anything else (a backend without these kernels, the C++ backend, symbolic sizes, an op a subgraph uses that
ember cannot render, gradients for captured tensors) raises Unsupported and runs the ATen op.
"""
from __future__ import annotations

import logging

import sympy
import torch

from .. import metrics, state
from ..codegen.triton import flex_attention_backward as backward_kernels
from ..codegen.triton.flex_attention import FlexProblem, RenderedMod, blocks, forward_source, supports_blocks
from ..codegen.triton.heuristics import next_pow2
from ..codegen.triton.flex_subgraph import SubgraphInputs, SubgraphRenderer, captured_base, lower_subgraph, render
from ..device import backend_for
from ..ir.kernel_call import KernelCall, Launch
from ..ir.nodes import Layout, MultiOutput, TensorBox
from .fallback import realize_arg
from .registry import Unsupported, lower_higher_order

log = logging.getLogger("ember.flex_attention")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
OPERANDS = ("q", "k", "v", "out", "do", "lse", "dlse")     # the stored tensors that are no BlockMask tensor


def _wants_kernels(query) -> bool:
    backend = backend_for(query.get_device())
    return getattr(backend, "name", "").startswith("triton")


def _ints(values) -> list[int]:
    if not all(isinstance(sympy.sympify(v), sympy.Integer) for v in values):
        raise Unsupported("flex attention with symbolic sizes or strides")
    return [int(v) for v in values]


def _stored(box, meta=None):
    """A tensor argument stored (Buffer or ReinterpretView) with static layout."""
    if not isinstance(box, TensorBox):
        raise Unsupported("flex attention argument is not a tensor")
    x = realize_arg(box, meta)
    _ints([*x.layout.size, *x.layout.stride, x.layout.offset])
    return x


def _strides(x) -> list[int]:
    """x's strides, 0 along a dimension of size 1 (so indexing it by a batch or head broadcasts)."""
    return [0 if int(n) == 1 else int(s) for n, s in zip(x.layout.size, x.layout.stride)]


class BlockMaskArgs:
    """The BlockMask tuple as the HOP carries it: (q_len, kv_len, kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, [torch
    >= 2.10: four dq_* orders], SPARSE_Q, SPARSE_KV, mask_mod graph)."""
    NAMES = ("kv_num", "kv_idx", "full_kv_num", "full_kv_idx", "q_num", "q_idx", "full_q_num", "full_q_idx")

    def __init__(self, block_mask: tuple, q_len: int, kv_len: int):
        self.tensors = dict(zip(self.NAMES, block_mask[2:10]))
        sparse_q, sparse_kv = _ints(block_mask[-3:-1])
        # a sparse block covering the whole sequence (flex_attention's default mask has blocks of 2**30) is
        # the one block 0: any size that covers the sequence and that kernel blocks divide says the same
        self.sparse_q = sparse_q if sparse_q < q_len else max(16, next_pow2(q_len))
        self.sparse_kv = sparse_kv if sparse_kv < kv_len else max(16, next_pow2(kv_len))
        self.mask_graph = block_mask[-1]

    def stored(self, names) -> dict:
        return {n: _stored(self.tensors[n]) for n in names if self.tensors[n] is not None}


def _render_mods(device, score_mod, mask_graph, joint_graph, score_captured, mask_captured, pointers,
                 bases: list) -> tuple:
    """(rendered score_mod or None for the identity, rendered mask_mod, rendered joint graph's score gradient
    or None without one) over the kernel's tile names. Constants a subgraph reads join `pointers` and `bases`."""
    inputs = SubgraphInputs(device, [])
    tile_mask = "tile_in"
    score = joint = None
    if not _is_identity(score_mod):
        [out] = lower_subgraph(score_mod, [inputs.tile("score")] + inputs.index, score_captured)
        r = SubgraphRenderer("sm", pointers, tile_mask, bases)
        score = RenderedMod(r.lines, _as_float(render(out, r)))
    [keep] = lower_subgraph(mask_graph, inputs.index, mask_captured)
    r = SubgraphRenderer("mm", pointers, tile_mask, bases)
    mask = RenderedMod(r.lines, render(keep, r).name)
    if joint_graph is not None:
        grad, *rest = lower_subgraph(joint_graph, [inputs.tile("score")] + inputs.index + [inputs.tile("dpost")],
                                     score_captured)
        if any(x is not None for x in rest[4:]):
            raise Unsupported("flex attention backward with gradients for captured tensors")
        r = SubgraphRenderer("jg", pointers, tile_mask, bases)
        joint = RenderedMod(r.lines, _as_float(render(grad, r)))
    return score, mask, joint


def _as_float(v) -> str:
    return v.name if v.dtype == torch.float32 else f"({v.name}).to(tl.float32)"


def _is_identity(gm) -> bool:
    nodes = list(gm.graph.nodes)
    out = nodes[-1]
    first = next(n for n in nodes if n.op == "placeholder")
    return out.op == "output" and out.args[0] is first or (isinstance(out.args[0], (list, tuple))
                                                            and len(out.args[0]) == 1 and out.args[0][0] is first)


def captured_inputs(score_other, mask_other) -> tuple[list, list, dict]:
    """(score_mod's captured TensorBoxes, mask_mod's, buffer name -> pointer parameter, those buffers) with
    every captured tensor stored; the kernels take each base buffer once, as a parameter `CAPn`."""
    def store(values):
        out = []
        for v in values:
            if not isinstance(v, TensorBox):
                raise Unsupported("flex attention captures a value that is not a tensor")
            out.append(TensorBox(_stored(v)))
        return out
    s, m = store(score_other), store(mask_other)
    pointers: dict = {}
    bases: list = []
    for box in s + m:
        base = captured_base(box.data)
        if base.get_name() not in pointers:
            pointers[base.get_name()] = f"CAP{len(pointers)}"
            bases.append(base)
    return s, m, pointers, bases


def check_shapes(q, k, v) -> tuple:
    (B, Hq, M, D), (Bkv, Hkv, N, Dk), (Bv, Hv, Nv, Dv) = (_ints(x.get_size()) for x in (q, k, v))
    if q.get_dtype() not in DTYPES or k.get_dtype() != q.get_dtype() or v.get_dtype() != q.get_dtype():
        raise Unsupported("flex attention dtype")
    if Dk != D or (Bv, Hv, Nv) != (Bkv, Hkv, N) or Hq % Hkv or Bkv not in (1, B):
        raise Unsupported("flex attention shapes")
    if max(D, Dv) > MAX_HEAD_DIM or min(B, Hq, M, N, D, Dv) == 0:
        raise Unsupported("flex attention head dim or empty input")
    return B, Hq, M, D, Bkv, Hkv, N, Dv


def build_problem(q, k, v, score_mod, bm: BlockMaskArgs, scale, score_other, mask_other, stored: dict,
                  has_max: bool, joint_graph=None):
    """(FlexProblem without the strides of the outputs, the captured pointer buffers, the rendered joint graph
    or None)."""
    B, Hq, M, D, Bkv, Hkv, N, Dv = check_shapes(q, k, v)
    s_cap, m_cap, pointers, bases = captured_inputs(score_other, mask_other)
    try:
        score, mask, joint = _render_mods(q.get_device(), score_mod, bm.mask_graph, joint_graph, s_cap, m_cap,
                                          pointers, bases)
    except Unsupported:
        raise
    except Exception as e:      # an op the renderer cannot spell: the ATen op is always right
        log.debug("flex attention subgraph not rendered: %r", e)
        raise Unsupported(f"flex attention subgraph: {e}") from e
    interpreted = bool(getattr(backend_for(q.get_device()), "interpreted", False))
    problem = FlexProblem(
        B, Hq, M, D, Bkv, Hkv, N, Dv, q.get_dtype(), float(scale),
        {n: _strides(stored[n]) for n in OPERANDS if n in stored},
        bm.sparse_q, bm.sparse_kv, {n: _strides(x) for n, x in stored.items() if n not in OPERANDS},
        "full_kv_num" in stored, score, mask, list(pointers.values()), has_max, interpreted)
    if not supports_blocks(problem):
        raise Unsupported("flex attention sparse block sizes")
    return problem, bases, joint


def results(call: KernelCall, layouts: list) -> list:
    g = state.current_graph()
    g.register_buffer(call)
    outs = []
    for i, layout in enumerate(layouts):
        r = g.register_buffer(MultiOutput(None, layout, call, (i,)))
        call.results.append(r)
        outs.append(TensorBox(r))
    return outs


def _metas(node, count):
    if node is None:
        return [None] * count
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:count]]


@lower_higher_order(torch.ops.higher_order.flex_attention)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                   score_mod_other_buffers=(), mask_mod_other_buffers=()):
    if not _wants_kernels(query):
        raise Unsupported("flex attention kernels need the Triton backend")
    node = state.current_graph().current_node
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in val):
        raise Unsupported("flex attention without fake outputs")
    _, _, M, _, _, _, N, _ = check_shapes(query, key, value)
    bm = BlockMaskArgs(block_mask, M, N)
    mq, mk, mv = _metas(node, 3)
    stored = {"q": _stored(query, mq), "k": _stored(key, mk), "v": _stored(value, mv)}
    stored.update(bm.stored(("kv_num", "kv_idx", "full_kv_num", "full_kv_idx")))
    problem, captured, _ = build_problem(query, key, value, score_mod, bm, scale, score_mod_other_buffers,
                                      mask_mod_other_buffers, stored, has_max=len(val) >= 3)
    layouts = [Layout.from_tensor(t) for t in val]
    problem.strides["out"] = _ints(layouts[0].stride)
    if _ints(layouts[1].stride) != [problem.Hq * problem.M, problem.M, 1]:
        raise Unsupported("flex attention logsumexp layout")
    block_m, block_n = blocks(problem, dict(kernel_options or {}), problem.interpreted)
    meta = _launch_meta(problem, block_m, block_n)
    inputs = [stored["q"], stored["k"], stored["v"], stored["kv_num"], stored["kv_idx"]]
    if problem.has_full_kv:
        inputs += [stored["full_kv_num"], stored["full_kv_idx"]]
    inputs += captured
    grid = [-(-problem.M // block_m), problem.B * problem.Hq, 1]
    call = KernelCall("flex_attention", query.get_device(), inputs,
                      [Launch(lambda name: forward_source(name, problem), grid, meta)])
    metrics.flex_attention_kernels += 1
    return tuple(results(call, layouts))


def _launch_meta(problem: FlexProblem, block_m: int, block_n: int) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4 if block_m * block_n <= 64 * 64 else 8,
            "num_stages": 1 if problem.interpreted else 3}


@lower_higher_order(torch.ops.higher_order.flex_attention_backward)
def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers=(),
                            mask_mod_other_buffers=()):
    if not _wants_kernels(query):
        raise Unsupported("flex attention kernels need the Triton backend")
    node = state.current_graph().current_node
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, (list, tuple)) or len(val) < 3 or grad_out is None or joint_graph is None:
        raise Unsupported("flex attention backward without fake outputs, output gradient or joint graph")
    B, Hq, M, D, Bkv, Hkv, N, Dv = check_shapes(query, key, value)
    if Bkv != B:
        raise Unsupported("flex attention backward with a broadcast key/value batch")
    bm = BlockMaskArgs(block_mask, M, N)
    metas = _metas(node, 7)
    stored = {n: _stored(x, m) for n, x, m in zip(("q", "k", "v", "out", "lse", "do"),
                                                 (query, key, value, out, logsumexp, grad_out), metas)}
    if grad_logsumexp is not None:
        stored["dlse"] = _stored(grad_logsumexp, metas[6])
    stored.update(bm.stored(backward_kernels.MASK_NAMES))
    if "q_num" not in stored or "q_idx" not in stored:
        raise Unsupported("flex attention backward without the BlockMask's q_num_blocks / q_indices")
    problem, captured, joint = build_problem(query, key, value, fw_graph, bm, scale, score_mod_other_buffers,
                                             mask_mod_other_buffers, stored, has_max=False, joint_graph=joint_graph)
    for n in ("out", "do"):
        if stored[n].layout.size != stored["q"].layout.size[:3] + [Dv]:
            raise Unsupported("flex attention backward output shapes")
    for n in ("lse", "dlse"):
        if n in stored and _ints(stored[n].layout.stride) != [Hq * M, M, 1]:
            raise Unsupported("flex attention backward logsumexp layout")
    layouts = [Layout.from_tensor(t) for t in val[:3]]
    problem.strides.update(dq=_ints(layouts[0].stride), dk=_ints(layouts[1].stride), dv=_ints(layouts[2].stride))
    layouts.append(Layout.contiguous(query.get_device(), torch.float32, [B, Hq, M]))       # delta, scratch
    block_m, block_n = blocks(problem, dict(kernel_options or {}), problem.interpreted, backward=True)
    meta = _launch_meta(problem, block_m, block_n)
    inputs = [stored[n] for n in ("q", "k", "v", "out", "do", "lse", "dlse") if n in stored]
    inputs += [stored[n] for n in backward_kernels.MASK_NAMES if n in stored] + captured
    has_dlse = "dlse" in stored
    dq = Launch(lambda name: backward_kernels.dq_source(name, problem, joint, has_dlse),
                [-(-M // block_m), B * Hq, 1], meta)
    dkdv = Launch(lambda name: backward_kernels.dkdv_source(name, problem, joint, has_dlse),
                  [-(-N // block_n), B * Hkv, 1], meta)
    call = KernelCall("flex_attention_backward", query.get_device(), inputs, [dq, dkdv])
    metrics.flex_attention_kernels += 1
    dq_box, dk_box, dv_box, _ = results(call, layouts)
    return dq_box, dk_box, dv_box, tuple(None for _ in score_mod_other_buffers)
