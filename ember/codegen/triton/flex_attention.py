"""FlexAttention's forward as one Triton kernel (flex_launch.py builds the FlexProblem and the launch).

One program per (query block, batch * query head). It loads its [BLOCK_M, D] query tile once and walks the
key/value blocks the BlockMask lists for the query block's sparse row: first the partial blocks
(`kv_num_blocks` / `kv_indices`), where mask_mod is evaluated on the score tile, then the full blocks
(`full_kv_num_blocks` / `full_kv_indices`), where it is not; a block in neither list is never read. Each
sparse block (SPARSE_KV wide) is BLOCK_N-wide steps. Per step: the score tile `q @ k^T * scale` in float32,
score_mod's lines on it, mask_mod's (partial blocks) and the key tail set to -inf, then online softmax in
base 2: a running row max `m` and row sum `l` of `exp2(s * log2(e) - m)`, the accumulator rescaled by
`exp2(m_old - m_new)` before `p @ v` is added. With no score_mod, log2(e) is folded into the scale.

Results as the HOP returns them: the output (fully masked rows 0), the logsumexp and the row max, both in
base 2 (`lse / ln 2`, -inf for a fully masked row), float32.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from .heuristics import next_pow2
from .spelling import triton_type

LOG2E = 1.0 / math.log(2.0)


@dataclasses.dataclass
class RenderedMod:
    """A score_mod or mask_mod as Triton lines over the tile; `result` names its value."""
    lines: list
    result: str


@dataclasses.dataclass
class FlexProblem:
    """Everything a flex kernel's source depends on: sizes, strides (literals), the BlockMask's sparse block
    sizes and broadcasts, the rendered subgraphs and the captured tensors' pointer parameters."""
    B: int
    Hq: int
    M: int
    D: int
    Bkv: int
    Hkv: int
    N: int
    Dv: int
    dtype: torch.dtype
    scale: float
    strides: dict              # "q", "k", "v", "out" (and backward tensors) -> 4 ints
    sparse_q: int
    sparse_kv: int
    mask_strides: dict         # "kv_num", "kv_idx", "full_kv_num", ... -> strides over (b, h, row[, i])
    has_full_kv: bool
    score_mod: Optional[RenderedMod]     # None: the identity
    mask_mod: RenderedMod
    captured: list             # pointer parameter names of the captured tensors, in call order
    has_max: bool = True       # the HOP returns the row max too (torch >= 2.9)
    interpreted: bool = False

    @property
    def gqa(self) -> int:
        return self.Hq // self.Hkv

    @property
    def d_pad(self) -> int:
        return max(16, next_pow2(self.D))

    @property
    def dv_pad(self) -> int:
        return max(16, next_pow2(self.Dv))


def blocks(problem: FlexProblem, options: dict, interpreted: bool, backward: bool = False) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): kernel_options' where they divide the sparse blocks, else a default that does. The
    backward's programs hold four tiles of a key block and two of a query block: smaller blocks."""
    if interpreted:
        default_m, default_n = 32, 32
    elif backward:
        default_m, default_n = (64 if problem.d_pad <= 64 else 32), 64
    else:
        default_m, default_n = 128, (64 if problem.d_pad <= 64 else 32)
    bm = int(options.get("BLOCK_M", default_m))
    bn = int(options.get("BLOCK_N", default_n))
    bm = _fit(bm, problem.sparse_q, problem.M)
    bn = _fit(bn, problem.sparse_kv, problem.N)
    return bm, bn


def _fit(block: int, sparse: int, size: int) -> int:
    """The largest power of two <= block dividing `sparse`, at least 16, no larger than needed for `size`."""
    b = 1 << (max(block, 16).bit_length() - 1)
    while b > 16 and (sparse % b or b >= 2 * next_pow2(size)):
        b //= 2
    return b


def supports_blocks(problem: FlexProblem) -> bool:
    """The kernels walk each sparse block in steps of at least 16: the sparse sizes must be multiples."""
    return problem.sparse_q % 16 == 0 and problem.sparse_kv % 16 == 0


def _ptr(name: str, strides, parts) -> str:
    """`name + sum(index * stride)` over the parts (index expressions), dropping zero strides."""
    terms = [f"({p}) * {s}" for p, s in zip(parts, strides) if s != 0 and p != "0"]
    return f"{name} + " + " + ".join(terms) if terms else name


def common_prologue(p: FlexProblem) -> list[str]:
    """Lines binding flex_b, flex_h (query head), kv_b, kv_h of the program's (batch, head) = program_id(1).
    The BlockMask's tensors are indexed by flex_b and flex_h with stride 0 where they broadcast."""
    return [
        "bh = tl.program_id(1)",
        f"flex_b = bh // {p.Hq}",
        f"flex_h = bh % {p.Hq}",
        "kv_b = flex_b" if p.Bkv > 1 else "kv_b = 0",
        f"kv_h = flex_h // {p.gqa}",
    ]


def query_block_prologue(p: FlexProblem, q_ptr: str) -> list[str]:
    """Lines of a kernel with a program per query block (the forward, dq): the block's rows `offs_m` (in range:
    `row_in`; `flex_q_idx` for the subgraphs), the head-dim ranges and the query tile `q`."""
    return [
        "pid_m = tl.program_id(0)",
        *common_prologue(p),
        "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        f"row_in = offs_m < {p.M}",
        "flex_q_idx = offs_m[:, None]",
        f"offs_d = tl.arange(0, {p.d_pad})",
        f"offs_dv = tl.arange(0, {p.dv_pad})",
        f"q = tl.load({q_ptr}, mask=row_in[:, None] & (offs_d < {p.D})[None, :], other=0.0)",
    ]


def dot(p: FlexProblem, a: str, b: str, acc: Optional[str] = None) -> str:
    """tl.dot of two tiles with a float32 result. Triton's interpreter multiplies bfloat16 blocks wrongly,
    so there the operands are widened first (their products are exact in float32)."""
    if p.interpreted and p.dtype != torch.float32:
        a, b = f"{a}.to(tl.float32)", f"{b}.to(tl.float32)"
    precision = ", input_precision=\"ieee\"" if p.dtype == torch.float32 or p.interpreted else ""
    return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{precision})"


def score_lines(p: FlexProblem, masked: bool, qk: str = "qk") -> list[str]:
    """From the raw product tile `qk` to `s2`, the score in base-2 units with -inf where masked: score_mod,
    then mask_mod where `masked`, then the tails. Binds `score` (the scaled score) and `post` (after
    score_mod, natural units) for the backward's use."""
    lines = [f"score = {qk} * {p.scale!r}"]
    if p.score_mod is not None:
        lines += p.score_mod.lines + [f"post = {p.score_mod.result}"]
    else:
        lines.append("post = score")
    keep = "tile_in"
    if masked:
        lines += p.mask_mod.lines
        keep = f"tile_in & ({p.mask_mod.result} != 0)"
    lines.append(f"post = tl.where({keep}, post, float(\"-inf\"))")
    if p.score_mod is None:
        lines.append(f"s2 = tl.where({keep}, {qk} * {p.scale * LOG2E!r}, float(\"-inf\"))")
    else:
        lines.append(f"s2 = post * {LOG2E!r}")
    return lines


def tile_index_lines(start_n: str) -> list[str]:
    return [f"offs_n = {start_n} + tl.arange(0, BLOCK_N)",
            "flex_kv_idx = offs_n[None, :]",
            "tile_in = row_in[:, None] & (offs_n < N_CTX)[None, :]"]


def _fwd_step(p: FlexProblem, masked: bool) -> list[str]:
    sk, sv = p.strides["k"], p.strides["v"]
    k_ptr = _ptr("K", sk, ["kv_b", "kv_h", "offs_n[None, :]", "offs_d[:, None]"])
    v_ptr = _ptr("V", sv, ["kv_b", "kv_h", "offs_n[:, None]", "offs_dv[None, :]"])
    lines = [
        f"kt = tl.load({k_ptr}, mask=(offs_n < N_CTX)[None, :] & (offs_d < {p.D})[:, None], other=0.0)",
        f"qk = {dot(p, 'q', 'kt')}",
        *score_lines(p, masked),
        "m_new = tl.maximum(m_i, tl.max(s2, 1))",
        # a row with nothing unmasked so far keeps m = -inf; subtracting 0 then keeps every exp2 at 0
        "m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)",
        "alpha = tl.math.exp2(m_i - m_use)",
        "pexp = tl.math.exp2(s2 - m_use[:, None])",
        "l_i = l_i * alpha + tl.sum(pexp, 1)",
        f"vt = tl.load({v_ptr}, mask=(offs_n < N_CTX)[:, None] & (offs_dv < {p.Dv})[None, :], other=0.0)",
        f"acc = {dot(p, f'pexp.to({triton_type(p.dtype)})', 'vt', 'acc * alpha[:, None]')}",
        "m_i = m_new",
    ]
    return lines


def block_loop(p: FlexProblem, which: str, row: str, body: list[str], sparse: int, mask_prefix: str) -> list[str]:
    """Loop over the blocks listed for sparse row `row` in `{which}_num` / `{which}_idx`, each in BLOCK-wide
    steps (BLOCK_N in the forward), running `body` with `start` bound to the step's first position."""
    s_num, s_idx = p.mask_strides[f"{which}_num"], p.mask_strides[f"{which}_idx"]
    num = _ptr(f"{which.upper()}_NUM", s_num, ["flex_b", "flex_h", row])
    idx = _ptr(f"{which.upper()}_IDX", s_idx, ["flex_b", "flex_h", row, "i"])
    step = "BLOCK_N" if mask_prefix == "kv" else "BLOCK_M"
    lines = [f"n_blocks = tl.load({num})",
             "for i in range(0, n_blocks):",
             f"    blk = tl.load({idx})",
             f"    for j in range(0, {sparse} // {step}):",
             f"        start = blk * {sparse} + j * {step}"]
    return lines + ["        " + ln for ln in body]


def forward_source(name: str, p: FlexProblem) -> str:
    """The forward kernel's source: `name(Q, K, V, KV_NUM, KV_IDX[, FULL_KV_NUM, FULL_KV_IDX], *captured,
    OUT, LSE[, MAXS], BLOCK_M, BLOCK_N)`, grid (cdiv(M, BLOCK_M), B * Hq)."""
    sq, so = p.strides["q"], p.strides["out"]
    params = ["Q", "K", "V", "KV_NUM", "KV_IDX"] + (["FULL_KV_NUM", "FULL_KV_IDX"] if p.has_full_kv else [])
    params += p.captured + ["OUT", "LSE"] + (["MAXS"] if p.has_max else [])
    params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]
    q_ptr = _ptr("Q", sq, ["flex_b", "flex_h", "offs_m[:, None]", "offs_d[None, :]"])
    o_ptr = _ptr("OUT", so, ["flex_b", "flex_h", "offs_m[:, None]", "offs_dv[None, :]"])
    row_base = f"(flex_b * {p.Hq} + flex_h) * {p.M}"
    step = tile_index_lines("start") + _fwd_step(p, masked=True)
    full_step = tile_index_lines("start") + _fwd_step(p, masked=False)
    body = [
        f"N_CTX = {p.N}",
        *query_block_prologue(p, q_ptr),
        "m_i = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)",
        "l_i = tl.zeros([BLOCK_M], dtype=tl.float32)",
        f"acc = tl.zeros([BLOCK_M, {p.dv_pad}], dtype=tl.float32)",
        f"sparse_row = (pid_m * BLOCK_M) // {p.sparse_q}",
        *block_loop(p, "kv", "sparse_row", step, p.sparse_kv, "kv"),
    ]
    if p.has_full_kv:
        body += block_loop(p, "full_kv", "sparse_row", full_step, p.sparse_kv, "kv")
    body += [
        "l_use = tl.where(l_i == 0.0, 1.0, l_i)",
        "out = acc / l_use[:, None]",
        f"tl.store({o_ptr}, out.to({triton_type(p.dtype)}), mask=row_in[:, None] & (offs_dv < {p.Dv})[None, :])",
        "lse = tl.where(l_i == 0.0, float(\"-inf\"), m_i + tl.math.log2(l_use))",
        f"tl.store(LSE + {row_base} + offs_m, lse, mask=row_in)",
    ]
    if p.has_max:
        body.append(f"tl.store(MAXS + {row_base} + offs_m, m_i, mask=row_in)")
    return kernel_source(name, params, body)


def kernel_source(name: str, params: list, body: list) -> str:
    return "\n".join(["@triton.jit", f"def {name}({', '.join(params)}):"] + ["    " + ln for ln in body]) + "\n"
