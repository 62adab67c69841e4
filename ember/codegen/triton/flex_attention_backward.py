"""FlexAttention's backward as two Triton kernels, launched in order by one KernelCall.

Both recompute the probabilities of a [BLOCK_M, BLOCK_N] tile from the forward's logsumexp (base 2):
`p = exp2(s2 - lse)`, with s2 the forward's score after score_mod and mask_mod (codegen/triton/flex_attention.py,
`score_lines`). With `dp = dO @ v^T` and `delta = rowsum(O * dO) - dlse / ln 2`, the gradient of the score after
score_mod is `p * (dp - delta)`; the joint graph's lines (score_mod's gradient, rendered like score_mod) turn
it into the gradient of the scaled score, `ds`, times the scale, 0 where masked.

- dq kernel: one program per (query block, batch * query head), over the key blocks the BlockMask lists for
  its sparse row (as the forward). It first computes its rows' delta and stores it, then `dq += ds @ k`.
- dk/dv kernel (launched after, reading delta): one program per (key block, batch * key/value head), over
  the query heads of its GQA group and, for each, the query blocks the BlockMask lists for its sparse column
  (`q_num_blocks` / `q_indices` with mask_mod, `full_q_*` without): `dv += p^T @ dO`, `dk += ds^T @ q`, on
  tiles laid out transposed (keys along the rows).
"""
from __future__ import annotations

from .flex_attention import (FlexProblem, RenderedMod, _ptr, block_loop, bounds, dot, kernel_source,
                             query_block_prologue, row_bounds, score_lines, tile_in_line, tile_keep)
from .spelling import triton_type

# the kernels' pointer parameters, in call order (captured tensors between the inputs and the results)
INPUTS = ["Q", "K", "V", "OUT", "DO", "LSE"]
MASK_NAMES = ("kv_num", "kv_idx", "full_kv_num", "full_kv_idx", "q_num", "q_idx", "full_q_num", "full_q_idx")
MASKS = [m.upper() for m in MASK_NAMES]
RESULTS = ["DQ", "DK", "DV", "DELTA"]


def params(p: FlexProblem, has_dlse: bool) -> list[str]:
    names = INPUTS + (["DLSE"] if has_dlse else []) + [m for m in MASKS if _has(p, m)] + p.captured + RESULTS
    return names + ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]


def _has(p: FlexProblem, mask: str) -> bool:
    return mask.lower() in p.mask_strides


def _grad_lines(p: FlexProblem, masked: bool, joint: RenderedMod, per_query: str = "[:, None]") -> list[str]:
    """From `qk` (the tile's raw product), `lse2`, `delta` and `dp` (dO @ v^T) to `pexp` and `ds`. The
    per-query statistics broadcast along the tile by `per_query`: queries are the rows of the dq kernel's
    tiles and the columns of the dk/dv kernel's."""
    lines = [
        *score_lines(p, masked),
        f"pexp = tl.math.exp2(s2 - lse2{per_query})",
        f"dpost = pexp * (dp - delta{per_query})",
        *joint.lines,
    ]
    keep = tile_keep(p, masked)
    ds = f"{joint.result} * {p.scale!r}" if keep is None else f"tl.where({keep}, {joint.result} * {p.scale!r}, 0.0)"
    return lines + [f"ds = ({ds}).to({triton_type(p.dtype)})"]


def _row_stats_lines(p: FlexProblem, rows: str) -> list[str]:
    """Load lse (base 2; 0 for a fully masked row, whose scores are all -inf) and delta of rows `rows`."""
    return [f"lse2 = tl.load(LSE + (flex_b * {p.Hq} + flex_h) * {p.M} + {rows}{row_bounds(p, f'{rows} < {p.M}')})",
            "lse2 = tl.where(lse2 == float(\"-inf\"), 0.0, lse2)",
            f"delta = tl.load(DELTA + (flex_b * {p.Hq} + flex_h) * {p.M} + {rows}{row_bounds(p, f'{rows} < {p.M}')})"]


def dq_source(name: str, p: FlexProblem, joint: RenderedMod, has_dlse: bool) -> str:
    s = p.strides
    q_ptr = _ptr("Q", s["q"], ["flex_b", "flex_h", "offs_m[:, None]", "offs_d[None, :]"])
    o_ptr = _ptr("OUT", s["out"], ["flex_b", "flex_h", "offs_m[:, None]", "offs_dv[None, :]"])
    do_ptr = _ptr("DO", s["do"], ["flex_b", "flex_h", "offs_m[:, None]", "offs_dv[None, :]"])
    dq_ptr = _ptr("DQ", s["dq"], ["flex_b", "flex_h", "offs_m[:, None]", "offs_d[None, :]"])
    k_ptr = _ptr("K", s["k"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_d[None, :]"])
    v_ptr = _ptr("V", s["v"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_dv[None, :]"])
    rows = f"(flex_b * {p.Hq} + flex_h) * {p.M} + offs_m"

    def step(masked):
        return ["offs_n = start + tl.arange(0, BLOCK_N)",
                "flex_kv_idx = offs_n[None, :]",
                tile_in_line(p, "row_in", f"offs_n < {p.N}"),
                f"kb = tl.load({k_ptr}{bounds(p, f'offs_n < {p.N}', 'd')})",
                f"vb = tl.load({v_ptr}{bounds(p, f'offs_n < {p.N}', 'dv')})",
                f"qk = {dot(p, 'q', 'tl.trans(kb)')}",
                f"dp = {dot(p, 'do', 'tl.trans(vb)')}",
                *_grad_lines(p, masked, joint),
                f"dq = {dot(p, 'ds', 'kb', 'dq')}"]
    delta = "tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)"
    if has_dlse:
        delta += f" - tl.load(DLSE + {rows}{row_bounds(p, 'row_in')}) * {1.0 / 0.6931471805599453!r}"
    body = [
        *query_block_prologue(p, q_ptr),
        f"o = tl.load({o_ptr}{bounds(p, 'row_in', 'dv')})",
        f"do = tl.load({do_ptr}{bounds(p, 'row_in', 'dv')})",
        f"delta = {delta}",
        f"tl.store(DELTA + {rows}, delta{row_bounds(p, 'row_in', load=False)})",
        f"lse2 = tl.load(LSE + {rows}{row_bounds(p, 'row_in')})",
        "lse2 = tl.where(lse2 == float(\"-inf\"), 0.0, lse2)",
        f"dq = tl.zeros([BLOCK_M, {p.d_pad}], dtype=tl.float32)",
        f"sparse_row = (pid_m * BLOCK_M) // {p.sparse_q}",
        *block_loop(p, "kv", "sparse_row", step(True), p.sparse_kv, "kv"),
    ]
    if p.has_full_kv:
        body += block_loop(p, "full_kv", "sparse_row", step(False), p.sparse_kv, "kv")
    body.append(f"tl.store({dq_ptr}, dq.to({triton_type(p.dtype)}){bounds(p, 'row_in', 'd', load=False)})")
    return kernel_source(name, params(p, has_dlse), body)


def dkdv_source(name: str, p: FlexProblem, joint: RenderedMod, has_dlse: bool) -> str:
    """Tiles are [BLOCK_N, BLOCK_M]: keys along the rows, queries along the columns. So `p^T` and `ds^T` are
    computed as they are multiplied (`dv += p^T @ dO`, `dk += ds^T @ q`), never transposed in registers; only
    tiles loaded from memory are (the query tile is loaded as q^T)."""
    s = p.strides
    k_ptr = _ptr("K", s["k"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_d[None, :]"])
    v_ptr = _ptr("V", s["v"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_dv[None, :]"])
    dk_ptr = _ptr("DK", s["dk"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_d[None, :]"])
    dv_ptr = _ptr("DV", s["dv"], ["kv_b", "kv_h", "offs_n[:, None]", "offs_dv[None, :]"])
    qt_ptr = _ptr("Q", s["q"], ["flex_b", "flex_h", "offs_m[None, :]", "offs_d[:, None]"])
    do_ptr = _ptr("DO", s["do"], ["flex_b", "flex_h", "offs_m[:, None]", "offs_dv[None, :]"])

    def step(masked):
        return ["offs_m = start + tl.arange(0, BLOCK_M)",
                f"row_in = offs_m < {p.M}",
                "flex_q_idx = offs_m[None, :]",
                tile_in_line(p, "col_in", "row_in", shape="[BLOCK_N, BLOCK_M]"),
                f"qt = tl.load({qt_ptr}{bounds(p, 'row_in', 'd', seq_axis=1)})",
                f"do = tl.load({do_ptr}{bounds(p, 'row_in', 'dv')})",
                *_row_stats_lines(p, "offs_m"),
                f"qk = {dot(p, 'kb', 'qt')}",
                f"dp = {dot(p, 'vb', 'tl.trans(do)')}",
                *_grad_lines(p, masked, joint, per_query="[None, :]"),
                f"dv = {dot(p, f'pexp.to({triton_type(p.dtype)})', 'do', 'dv')}",
                f"dk = {dot(p, 'ds', 'tl.trans(qt)', 'dk')}"]
    body = [
        "pid_n = tl.program_id(0)",
        "bh = tl.program_id(1)",
        f"flex_b = bh // {p.Hkv}",
        "kv_b = flex_b",
        f"kv_h = bh % {p.Hkv}",
        "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"col_in = offs_n < {p.N}",
        "flex_kv_idx = offs_n[:, None]",
        f"offs_d = tl.arange(0, {p.d_pad})",
        f"offs_dv = tl.arange(0, {p.dv_pad})",
        f"kb = tl.load({k_ptr}{bounds(p, 'col_in', 'd')})",
        f"vb = tl.load({v_ptr}{bounds(p, 'col_in', 'dv')})",
        f"dk = tl.zeros([BLOCK_N, {p.d_pad}], dtype=tl.float32)",
        f"dv = tl.zeros([BLOCK_N, {p.dv_pad}], dtype=tl.float32)",
        f"sparse_col = (pid_n * BLOCK_N) // {p.sparse_kv}",
        f"for g in range(0, {p.gqa}):",
        f"    flex_h = kv_h * {p.gqa} + g",
    ]
    loops = block_loop(p, "q", "sparse_col", step(True), p.sparse_q, "q")
    if _has(p, "FULL_Q_NUM"):
        loops += block_loop(p, "full_q", "sparse_col", step(False), p.sparse_q, "q")
    body += ["    " + ln for ln in loops]
    body += [f"tl.store({dk_ptr}, dk.to({triton_type(p.dtype)}){bounds(p, 'col_in', 'd', load=False)})",
             f"tl.store({dv_ptr}, dv.to({triton_type(p.dtype)}){bounds(p, 'col_in', 'dv', load=False)})"]
    return kernel_source(name, params(p, has_dlse), body)
