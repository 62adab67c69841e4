"""Attention with few queries per key/value head (a decoding step) as Triton kernels: the launches for an
ir.kernel_call.ShortQueryAttentionSpec (lowering/short_attention.py).

The fused library kernels tile the queries of one head; with one query per head (or a few) their tiles are
almost empty and a call costs several microseconds of setup for a few kilobytes of work. Here one program
serves a key/value head and every query that reads it: the G = Hq / Hkv query heads of its group times the M
queries, ROWS = G * M rows of one [BLOCK_M, D] tile, so each key and value is read once per group. The
program walks its keys in BLOCK_N steps: the score tile `q @ k^T * scale` in float32, the mask (an additive
bias, a boolean keep-mask, or causal: key n seen by query i when n <= i), keys past the end set to -inf, then
online softmax: a running row max `m` and row sum `l`, the accumulator rescaled by `exp(m_old - m_new)`
before `p @ v` is added.

Long key sequences are split: `splits` programs per key/value head each walk CHUNK keys and store their
float32 accumulator, row max and row sum; a second kernel combines them (the partial results weighted by
`exp(m_s - m)`). With one split the first kernel stores the output itself. A row whose keys are all masked
gives zeros.
"""
from __future__ import annotations

import dataclasses

import torch

from ...ir.kernel_call import Launch, ShortQueryAttentionSpec
from ...lowering.registry import Unsupported
from .heuristics import next_pow2
from .spelling import triton_type

# Measured on an H100 (experiments/short_attention_probe.py: one query per head, 16 query heads over 4 key/value
# heads, head dim 64, bf16): 128-key blocks with 4 warps and 2 stages were the fastest or within 5% on every
# shape; up to 256 keys one program per key/value head is fastest (3.9 us against cuDNN's 7.4 for 208 keys),
# beyond that splits of 128 keys (1024 keys: 5.8 us against 6.0). From 4096 keys on, the library's kernel
# was faster (7.2 against 8.7 us), so on a GPU calls over more than GPU_MAX_KEYS keys stay with it.
BLOCK_N = 128
SINGLE_PASS_KEYS = 256
GPU_CHUNK = 128
GPU_MAX_KEYS = 1024
INTERPRETED_BLOCK_N, INTERPRETED_CHUNK = 16, 32
# programs worth launching on a GPU: splits are added until the heads' programs reach this many
GPU_PROGRAMS = 128
MAX_SPLITS = 64


@dataclasses.dataclass(frozen=True)
class Plan:
    rows: int                 # G * M: query rows per key/value head
    block_m: int
    block_d: int
    block_n: int
    chunk: int                # keys per split (a multiple of block_n)
    splits: int


def plan(spec: ShortQueryAttentionSpec, interpreted: bool, block_n: int = BLOCK_N, chunk: int = GPU_CHUNK) -> Plan:
    """How a call is tiled and split (`block_n` and `chunk`: the GPU's; experiments try others)."""
    B, Hq, M, D, Hkv, N, Dv = spec.sizes
    rows = Hq // Hkv * M
    if interpreted:
        block_n = INTERPRETED_BLOCK_N
        splits = min(MAX_SPLITS, -(-N // INTERPRETED_CHUNK))
    elif N <= SINGLE_PASS_KEYS:
        splits = 1
    else:
        splits = max(1, min(-(-N // chunk), GPU_PROGRAMS // (B * Hkv), MAX_SPLITS))
    chunk = -(-(-(-N // splits)) // block_n) * block_n
    splits = -(-N // chunk)
    return Plan(rows, max(16, next_pow2(rows)), max(16, next_pow2(max(D, Dv))), block_n, chunk, splits)


def scratch_layouts(spec: ShortQueryAttentionSpec, p: Plan) -> list:
    """(dtype, size) of each float32 scratch result the split kernels write: accumulators, row maxima, row
    sums per (batch * key/value head, split, row)."""
    if p.splits == 1:
        return []
    B, _, _, _, Hkv, _, Dv = spec.sizes
    heads = B * Hkv
    return [(torch.float32, [heads, p.splits, p.block_m, p.block_d]), (torch.float32, [heads, p.splits, p.block_m]),
            (torch.float32, [heads, p.splits, p.block_m])]


def launches(spec: ShortQueryAttentionSpec, interpreted: bool, p: Plan = None, num_warps: int = 4,
             num_stages: int = 2) -> tuple[list, list]:
    """(the scratch results' (dtype, size), the Launches) for one call; Unsupported where the library's kernel
    is faster."""
    if not interpreted and spec.sizes[5] > GPU_MAX_KEYS:
        raise Unsupported(f"attention over more than {GPU_MAX_KEYS} keys: the library's kernel is faster")
    p = p or plan(spec, interpreted)
    B, _, _, _, Hkv, _, _ = spec.sizes
    meta = {"BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "BLOCK_D": p.block_d,
            "num_warps": 1 if interpreted else num_warps, "num_stages": 1 if interpreted else num_stages}
    out = [Launch(lambda name: main_source(name, spec, p, interpreted), [B * Hkv, p.splits, 1], dict(meta))]
    if p.splits > 1:
        out.append(Launch(lambda name: combine_source(name, spec, p), [B * Hkv, 1, 1], dict(meta)))
    return scratch_layouts(spec, p), out


def _params(spec: ShortQueryAttentionSpec, p: Plan) -> str:
    names = ["Q", "K", "V"] + (["BIAS"] if "bias" in spec.operands else []) + ["OUT"]
    return ", ".join(names + (["PACC", "PM", "PL"] if p.splits > 1 else []))


def _row_lines(spec: ShortQueryAttentionSpec, p: Plan) -> list:
    """The program's key/value head `hk` of batch `b`, and per tile row its query head `h` and query `i`."""
    _, _, M, _, Hkv, _, _ = spec.sizes
    G = spec.sizes[1] // Hkv
    return [f"b = tl.program_id(0) // {Hkv}",
            f"hk = tl.program_id(0) % {Hkv}",
            "r = tl.arange(0, BLOCK_M)",
            f"rmask = r < {p.rows}",
            f"h = hk * {G} + r // {M}",
            f"i = r % {M}"]


def main_source(name: str, spec: ShortQueryAttentionSpec, p: Plan, interpreted: bool) -> str:
    B, Hq, M, D, Hkv, N, Dv = spec.sizes
    sq, sk, sv = (spec.strides[n] for n in ("q", "k", "v"))
    dot_in = "" if spec.dtype != torch.float32 and not interpreted else ".to(tl.float32)"
    precision = ", input_precision=\"ieee\"" if dot_in or spec.dtype == torch.float32 else ""
    lines = _row_lines(spec, p) + [
        "d = tl.arange(0, BLOCK_D)",
        f"qmask = rmask[:, None] & (d < {D})[None, :]",
        f"q = tl.load(Q + b * {sq[0]} + h[:, None] * {sq[1]} + i[:, None] * {sq[2]} + d[None, :] * {sq[3]}, "
        f"qmask, other=0.0){dot_in}",
        "m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)",
        "l_i = tl.zeros([BLOCK_M], dtype=tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)",
        f"start = tl.program_id(1) * {p.chunk}",
        f"stop = tl.minimum(start + {p.chunk}, {N})",
        f"for n0 in range(0, {p.chunk}, BLOCK_N):",
    ]
    body = [
        "n = start + n0 + tl.arange(0, BLOCK_N)",
        "nmask = n < stop",
        f"k = tl.load(K + b * {sk[0]} + hk * {sk[1]} + n[:, None] * {sk[2]} + d[None, :] * {sk[3]}, "
        f"nmask[:, None] & (d < {D})[None, :], other=0.0){dot_in}",
        f"s = tl.dot(q, tl.trans(k){precision}) * {spec.scale!r}",
    ]
    keep = "nmask[None, :]"
    if "bias" in spec.operands:
        sb = spec.strides["bias"]
        load = (f"tl.load(BIAS + b * {sb[0]} + h[:, None] * {sb[1]} + i[:, None] * {sb[2]} + n[None, :] * {sb[3]}, "
                f"rmask[:, None] & nmask[None, :], other=0)")
        if spec.mask == "boolean":
            keep += f" & ({load} != 0)"
        else:
            body.append(f"s = s + {load}.to(tl.float32)")
    if spec.is_causal:
        keep += " & (n[None, :] <= i[:, None])"
    body += [
        f"s = tl.where({keep}, s, float('-inf'))",
        "m_new = tl.maximum(m_i, tl.max(s, 1))",
        # a row with no key seen yet keeps m = -inf: exp(-inf - 0) = 0 leaves it empty rather than NaN
        "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
        "pr = tl.exp(s - m_safe[:, None])",
        "alpha = tl.exp(m_i - m_safe)",
        "l_i = l_i * alpha + tl.sum(pr, 1)",
        f"v = tl.load(V + b * {sv[0]} + hk * {sv[1]} + n[:, None] * {sv[2]} + d[None, :] * {sv[3]}, "
        f"nmask[:, None] & (d < {Dv})[None, :], other=0.0){dot_in}",
        f"acc = acc * alpha[:, None] + tl.dot(pr.to({'tl.float32' if dot_in else triton_type(spec.dtype)}), v"
        f"{precision})",
        "m_i = m_new",
    ]
    lines += ["    " + ln for ln in body]
    if p.splits == 1:
        lines += _store_out(spec, "acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]")
    else:
        heads_split = f"(tl.program_id(0) * {p.splits} + tl.program_id(1))"
        lines += [f"tl.store(PACC + {heads_split} * {p.block_m * p.block_d} + r[:, None] * {p.block_d} + d[None, :], "
                  "acc)",
                  f"tl.store(PM + {heads_split} * {p.block_m} + r, m_i)",
                  f"tl.store(PL + {heads_split} * {p.block_m} + r, l_i)"]
    return _kernel(name, spec, p, lines)


def combine_source(name: str, spec: ShortQueryAttentionSpec, p: Plan) -> str:
    """The second kernel of a split call: per key/value head, the splits' results combined into the output."""
    lines = _row_lines(spec, p) + [
        "d = tl.arange(0, BLOCK_D)",
        f"s = tl.arange(0, {next_pow2(p.splits)})",
        f"smask = s < {p.splits}",
        f"base = tl.program_id(0) * {p.splits} + s",
        f"pm = tl.load(PM + base[:, None] * {p.block_m} + r[None, :], smask[:, None], other=float('-inf'))",
        f"pl = tl.load(PL + base[:, None] * {p.block_m} + r[None, :], smask[:, None], other=0.0)",
        "m = tl.max(pm, 0)",
        "m_safe = tl.where(m == float('-inf'), 0.0, m)",
        "w = tl.exp(pm - m_safe[None, :])",
        "l = tl.sum(pl * w, 0)",
        "acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)",
        f"for j in range({p.splits}):",
        f"    wj = tl.exp(tl.load(PM + (tl.program_id(0) * {p.splits} + j) * {p.block_m} + r) - m_safe)",
        f"    acc += wj[:, None] * tl.load(PACC + (tl.program_id(0) * {p.splits} + j) * {p.block_m * p.block_d} "
        f"+ r[:, None] * {p.block_d} + d[None, :])",
    ]
    lines += _store_out(spec, "acc / tl.where(l == 0.0, 1.0, l)[:, None]")
    return _kernel(name, spec, p, lines)


def _store_out(spec: ShortQueryAttentionSpec, value: str) -> list:
    so, Dv = spec.strides["out"], spec.sizes[6]
    return [f"tl.store(OUT + b * {so[0]} + h[:, None] * {so[1]} + i[:, None] * {so[2]} + d[None, :] * {so[3]}, "
            f"({value}).to({triton_type(spec.dtype)}), rmask[:, None] & (d < {Dv})[None, :])"]


def _kernel(name: str, spec: ShortQueryAttentionSpec, p: Plan, lines: list) -> str:
    consts = "BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr"
    head = ["@triton.jit", f"def {name}({_params(spec, p)}, {consts}):"]
    return "\n".join(head + ["    " + ln for ln in lines]) + "\n"
