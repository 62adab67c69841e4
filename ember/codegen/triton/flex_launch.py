"""FlexAttention's launches on the Triton backend: a FlexAttentionSpec (ir/kernel_call.py, written by
lowering/flex_attention.py) -> the buffers the kernels read through the captured-tensor pointers, and the
Launches of the forward kernel (flex_attention.py) or of the backward's two (flex_attention_backward.py).

Here score_mod, mask_mod and the joint graph are lowered and rendered inline (flex_subgraph.py), the
FlexProblem the kernel sources depend on is built, and the block sizes, warps and stages are chosen.
"""
from __future__ import annotations

import logging

import torch

from ...ir.kernel_call import FlexAttentionSpec, Launch
from ...lowering.registry import Unsupported
from . import flex_attention_backward as backward_kernels
from .flex_attention import FlexProblem, RenderedMod, forward_source, launch_config, supports_blocks
from .flex_subgraph import SubgraphInputs, SubgraphRenderer, captured_base, lower_subgraph, render
from .heuristics import next_pow2

log = logging.getLogger("ember.flex_attention")

RESULT_STRIDES = ("out", "dq", "dk", "dv")      # the results the kernels index with literal strides
# Head dims above this run as the ATen op on GPUs: FLEX_CONFIGS has launch shapes up to 256 only
GPU_MAX_HEAD_DIM = 256


def flex_attention_launches(spec: FlexAttentionSpec, interpreted: bool) -> tuple[list, list[Launch]]:
    """(the captured tensors' base buffers, in the kernels' CAPn parameter order, the Launches)."""
    _, _, _, D, _, _, _, Dv = spec.sizes
    if not interpreted and max(D, Dv) > GPU_MAX_HEAD_DIM:
        raise Unsupported(f"flex attention head dims above {GPU_MAX_HEAD_DIM} on a GPU")
    problem, bases, joint = build_problem(spec, interpreted)
    capability = None if interpreted else torch.cuda.get_device_capability(spec.operands["q"].get_device())

    def launch(kernel: str, source, rows: int, heads: int) -> Launch:
        c = launch_config(problem, kernel, spec.kernel_options, capability)
        grid = [-(-rows // (c.block_n if kernel == "dkdv" else c.block_m)), problem.B * heads, 1]
        meta = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "num_warps": c.num_warps, "num_stages": c.num_stages}
        return Launch(source, grid, meta)

    if not spec.backward:
        return bases, [launch("forward", lambda name: forward_source(name, problem), problem.M, problem.Hq)]
    has_dlse = "dlse" in spec.operands
    dq = launch("dq", lambda name: backward_kernels.dq_source(name, problem, joint, has_dlse), problem.M, problem.Hq)
    dkdv = launch("dkdv", lambda name: backward_kernels.dkdv_source(name, problem, joint, has_dlse),
                  problem.N, problem.Hkv)
    return bases, [dq, dkdv]


def build_problem(spec: FlexAttentionSpec, interpreted: bool) -> tuple:
    """(FlexProblem, the captured pointer buffers, the rendered joint graph or None)."""
    B, Hq, M, D, Bkv, Hkv, N, Dv = spec.sizes
    pointers, bases = captured_pointers(spec.score_captured + spec.mask_captured)
    try:
        score, mask, joint = _render_mods(spec, pointers, bases)
    except Unsupported:
        raise
    except Exception as e:      # an op the renderer cannot spell: the ATen op is always right
        log.debug("flex attention subgraph not rendered: %r", e)
        raise Unsupported(f"flex attention subgraph: {e}") from e
    strides = {n: _strides(x) for n, x in spec.operands.items()}
    strides.update({n: [int(s) for s in spec.results[n].stride] for n in RESULT_STRIDES if n in spec.results})
    sparse_q, sparse_kv = _sparse_size(spec.sparse_q, M), _sparse_size(spec.sparse_kv, N)
    problem = FlexProblem(
        B, Hq, M, D, Bkv, Hkv, N, Dv, spec.dtype, spec.scale, strides, sparse_q, sparse_kv,
        {n: _strides(x) for n, x in spec.block_mask.items()}, "full_kv_num" in spec.block_mask,
        score, mask, list(pointers.values()), "max" in spec.results, interpreted,
        divisible=M % sparse_q == 0 and N % sparse_kv == 0)
    if not supports_blocks(problem):
        raise Unsupported("flex attention sparse block sizes")
    return problem, bases, joint


def _sparse_size(given: int, length: int) -> int:
    # a sparse block covering the whole sequence (flex_attention's default mask has blocks of 2**30) is the
    # one block 0: any size that covers the sequence and that kernel blocks divide says the same
    return given if given < length else max(16, next_pow2(length))


def _strides(x) -> list[int]:
    """x's strides, 0 along a dimension of size 1 (so indexing it by a batch or head broadcasts)."""
    return [0 if int(n) == 1 else int(s) for n, s in zip(x.layout.size, x.layout.stride)]


def captured_pointers(captured: list) -> tuple[dict, list]:
    """(buffer name -> pointer parameter, those buffers): the kernels take each captured tensor's base buffer
    once, as a parameter `CAPn`."""
    pointers: dict = {}
    bases: list = []
    for box in captured:
        base = captured_base(box.data)
        if base.get_name() not in pointers:
            pointers[base.get_name()] = f"CAP{len(pointers)}"
            bases.append(base)
    return pointers, bases


def _render_mods(spec: FlexAttentionSpec, pointers: dict, bases: list) -> tuple:
    """(rendered score_mod or None for the identity, rendered mask_mod, rendered joint graph's score gradient
    or None without one) over the kernel's tile names. Constants a subgraph reads join `pointers` and `bases`."""
    device = spec.operands["q"].get_device()
    inputs = SubgraphInputs(device, [])
    tile_mask = "tile_in"
    score = joint = None
    if not _is_identity(spec.score_mod):
        [out] = lower_subgraph(spec.score_mod, [inputs.tile("score")] + inputs.index, spec.score_captured)
        r = SubgraphRenderer("sm", pointers, tile_mask, bases)
        score = RenderedMod(r.lines, _as_float(render(out, r)))
    [keep] = lower_subgraph(spec.mask_mod, inputs.index, spec.mask_captured)
    r = SubgraphRenderer("mm", pointers, tile_mask, bases)
    mask = RenderedMod(r.lines, render(keep, r).name)
    if spec.joint is not None:
        grad, *rest = lower_subgraph(spec.joint, [inputs.tile("score")] + inputs.index + [inputs.tile("dpost")],
                                     spec.score_captured)
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
