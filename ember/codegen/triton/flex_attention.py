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
    divisible: bool = False    # M and N are multiples of the sparse blocks (so of every kernel block)

    @property
    def gqa(self) -> int:
        return self.Hq // self.Hkv

    @property
    def d_pad(self) -> int:
        return max(16, next_pow2(self.D))

    @property
    def dv_pad(self) -> int:
        return max(16, next_pow2(self.Dv))


@dataclasses.dataclass(frozen=True)
class FlexConfig:
    """One flex kernel's launch shape: its query and key block sizes, warps and pipeline stages."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Default launch shapes: (kernel, GPU class, head dim padded up to) -> FlexConfig, first match. The forward
# and dq kernels have a program per BLOCK_M query rows stepping BLOCK_N keys; the dk/dv kernel a program per
# BLOCK_N keys stepping BLOCK_M queries, holding four [BLOCK_N, D] tiles. "sm90" is Hopper and later with
# 16-bit inputs, "sm80" Ampere with 16-bit inputs, "fp32" any GPU with float32 inputs (no 16-bit tensor
# cores: smaller tiles), "interpreter" Triton's CPU interpreter (small tiles keep tests fast). The sm90
# entries for head dims 64 and 128 are the fastest of experiments/flex_config_sweep.py on an H100.
FLEX_CONFIGS = {
    ("forward", "sm90", 64): FlexConfig(128, 128, 4, 3),
    ("forward", "sm90", 128): FlexConfig(128, 64, 4, 2),
    ("forward", "sm90", 256): FlexConfig(64, 32, 4, 3),
    ("dq", "sm90", 64): FlexConfig(64, 64, 4, 3),
    ("dq", "sm90", 128): FlexConfig(64, 64, 4, 2),
    ("dq", "sm90", 256): FlexConfig(64, 64, 4, 2),
    ("dkdv", "sm90", 64): FlexConfig(64, 64, 4, 3),
    ("dkdv", "sm90", 128): FlexConfig(64, 64, 4, 2),
    ("dkdv", "sm90", 256): FlexConfig(64, 64, 4, 2),
    ("forward", "sm80", 128): FlexConfig(128, 64, 4, 3),
    ("forward", "sm80", 256): FlexConfig(64, 32, 4, 3),
    ("dq", "sm80", 256): FlexConfig(64, 64, 4, 2),
    ("dkdv", "sm80", 256): FlexConfig(64, 64, 4, 2),
    ("forward", "fp32", 256): FlexConfig(64, 32, 4, 3),
    ("dq", "fp32", 256): FlexConfig(32, 32, 4, 2),
    ("dkdv", "fp32", 256): FlexConfig(32, 32, 4, 2),
}
INTERPRETER_CONFIG = FlexConfig(32, 32, 1, 1)
# kernel_options' names for each kernel's blocks, as torch's flex_attention documents them
OPTION_NAMES = {"forward": ("BLOCK_M", "BLOCK_N"), "dq": ("BLOCK_M2", "BLOCK_N2"), "dkdv": ("BLOCK_M1", "BLOCK_N1")}


def gpu_class(dtype: torch.dtype, capability: tuple) -> str:
    if dtype == torch.float32:
        return "fp32"
    return "sm90" if capability >= (9, 0) else "sm80"


def launch_config(problem: FlexProblem, kernel: str, options: dict, capability: Optional[tuple]) -> FlexConfig:
    """The launch shape of `kernel` ("forward", "dq" or "dkdv"): FLEX_CONFIGS' (the interpreter's where
    `capability` is None), with kernel_options' blocks (BLOCK_M/BLOCK_N, BLOCK_M2/BLOCK_N2 for dq,
    BLOCK_M1/BLOCK_N1 for dk/dv, falling back to BLOCK_M/BLOCK_N), num_warps and num_stages where given;
    each block then shrunk to a power of two that divides the BlockMask's sparse blocks."""
    if capability is None:
        base = INTERPRETER_CONFIG
    else:
        cls, d = gpu_class(problem.dtype, capability), max(problem.d_pad, problem.dv_pad)
        base = next((c for (k, g, most), c in FLEX_CONFIGS.items() if k == kernel and g == cls and d <= most),
                    FlexConfig(32, 32, 4, 1))
    m_name, n_name = OPTION_NAMES[kernel]
    bm = int(options.get(m_name, options.get("BLOCK_M", base.block_m)))
    bn = int(options.get(n_name, options.get("BLOCK_N", base.block_n)))
    return FlexConfig(_fit(bm, problem.sparse_q, problem.M), _fit(bn, problem.sparse_kv, problem.N),
                      int(options.get("num_warps", base.num_warps)), int(options.get("num_stages", base.num_stages)))


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


def bounds(p: FlexProblem, seq: Optional[str], dim: Optional[str], seq_axis: int = 0, load: bool = True) -> str:
    """The mask argument of a 2-D tile's load (with `other=0.0`) or store: `seq`, a condition over the tile's
    sequence positions (on axis `seq_axis`), and the head-dim range `dim` ("d" or "dv") in bounds. Each part
    is left out where it always holds: positions when the problem is divisible, the head dim when it is a
    power of two; "" when nothing is left."""
    parts = []
    if seq is not None and not p.divisible:
        parts.append(f"({seq})[:, None]" if seq_axis == 0 else f"({seq})[None, :]")
    if dim is not None:
        size = p.D if dim == "d" else p.Dv
        if size != (p.d_pad if dim == "d" else p.dv_pad):
            parts.append(f"(offs_{dim} < {size})[None, :]" if seq_axis == 0 else f"(offs_{dim} < {size})[:, None]")
    if not parts:
        return ""
    return f", mask={' & '.join(parts)}" + (", other=0.0" if load else "")


def row_bounds(p: FlexProblem, cond: str, load: bool = True) -> str:
    """The mask argument of a 1-D per-row load or store: `cond`, left out when the problem is divisible."""
    if p.divisible:
        return ""
    return f", mask={cond}" + (", other=0.0" if load else "")


def tile_in_line(p: FlexProblem, rows: str, cols: str, shape: str = "[BLOCK_M, BLOCK_N]") -> str:
    """Binds `tile_in`, the score tile's in-range positions (subgraphs mask their loads of captured tensors
    with it), from its rows' and columns' conditions: all true when the problem is divisible."""
    if p.divisible:
        return f"tile_in = tl.full({shape}, 1, tl.int1)"
    return f"tile_in = ({rows})[:, None] & ({cols})[None, :]"


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
        f"q = tl.load({q_ptr}{bounds(p, 'row_in', 'd')})",
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
    keep = tile_keep(p, masked)
    if masked:
        lines += p.mask_mod.lines
    if keep is not None:
        lines.append(f"post = tl.where({keep}, post, float(\"-inf\"))")
    if p.score_mod is not None:
        lines.append(f"s2 = post * {LOG2E!r}")
    elif keep is not None:
        lines.append(f"s2 = tl.where({keep}, {qk} * {p.scale * LOG2E!r}, float(\"-inf\"))")
    else:
        lines.append(f"s2 = {qk} * {p.scale * LOG2E!r}")
    return lines


def tile_keep(p: FlexProblem, masked: bool) -> Optional[str]:
    """The condition a score tile's positions are kept under: in range, and mask_mod's where `masked` (after
    its lines); None when every position is kept (a full block of a divisible problem)."""
    conds = ([] if p.divisible else ["tile_in"]) + ([f"({p.mask_mod.result} != 0)"] if masked else [])
    return " & ".join(conds) or None


def tile_index_lines(p: FlexProblem, start_n: str) -> list[str]:
    return [f"offs_n = {start_n} + tl.arange(0, BLOCK_N)",
            "flex_kv_idx = offs_n[None, :]",
            tile_in_line(p, "row_in", f"offs_n < {p.N}")]


def _fwd_step(p: FlexProblem, masked: bool) -> list[str]:
    sk, sv = p.strides["k"], p.strides["v"]
    k_ptr = _ptr("K", sk, ["kv_b", "kv_h", "offs_n[None, :]", "offs_d[:, None]"])
    v_ptr = _ptr("V", sv, ["kv_b", "kv_h", "offs_n[:, None]", "offs_dv[None, :]"])
    lines = [
        f"kt = tl.load({k_ptr}{bounds(p, f'offs_n < {p.N}', 'd', seq_axis=1)})",
        f"qk = {dot(p, 'q', 'kt')}",
        *score_lines(p, masked),
        "m_new = tl.maximum(m_i, tl.max(s2, 1))",
        # a row with nothing unmasked so far keeps m = -inf; subtracting 0 then keeps every exp2 at 0
        "m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)",
        "alpha = tl.math.exp2(m_i - m_use)",
        "pexp = tl.math.exp2(s2 - m_use[:, None])",
        "l_i = l_i * alpha + tl.sum(pexp, 1)",
        f"vt = tl.load({v_ptr}{bounds(p, f'offs_n < {p.N}', 'dv')})",
        f"acc = {dot(p, f'pexp.to({triton_type(p.dtype)})', 'vt', 'acc * alpha[:, None]')}",
        "m_i = m_new",
    ]
    return lines


def block_loop(p: FlexProblem, which: str, row: str, body: list[str], sparse: int, mask_prefix: str) -> list[str]:
    """Loop over the blocks listed for sparse row `row` in `{which}_num` / `{which}_idx`, each in BLOCK-wide
    steps (BLOCK_N in the forward), running `body` with `start` bound to the step's first position.

    One flat loop over (listed block, step within it) rather than a loop per block: Triton pipelines the
    loads of one loop's next iterations (num_stages) across the blocks, where a nested loop of a few steps
    would start its pipeline over at every block."""
    s_num, s_idx = p.mask_strides[f"{which}_num"], p.mask_strides[f"{which}_idx"]
    step = "BLOCK_N" if mask_prefix == "kv" else "BLOCK_M"
    steps = f"({sparse} // {step})"
    num = _ptr(f"{which.upper()}_NUM", s_num, ["flex_b", "flex_h", row])
    idx = _ptr(f"{which.upper()}_IDX", s_idx, ["flex_b", "flex_h", row, f"t // {steps}"])
    lines = [f"n_steps = tl.load({num}) * {steps}",
             "for t in range(0, n_steps):",
             f"    start = tl.load({idx}) * {sparse} + (t % {steps}) * {step}"]
    return lines + ["    " + ln for ln in body]


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
    step = tile_index_lines(p, "start") + _fwd_step(p, masked=True)
    full_step = tile_index_lines(p, "start") + _fwd_step(p, masked=False)
    body = [
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
        f"tl.store({o_ptr}, out.to({triton_type(p.dtype)}){bounds(p, 'row_in', 'dv', load=False)})",
        "lse = tl.where(l_i == 0.0, float(\"-inf\"), m_i + tl.math.log2(l_use))",
        f"tl.store(LSE + {row_base} + offs_m, lse{row_bounds(p, 'row_in', load=False)})",
    ]
    if p.has_max:
        body.append(f"tl.store(MAXS + {row_base} + offs_m, m_i{row_bounds(p, 'row_in', load=False)})")
    return kernel_source(name, params, body)


def kernel_source(name: str, params: list, body: list) -> str:
    return "\n".join(["@triton.jit", f"def {name}({', '.join(params)}):"] + ["    " + ln for ln in body]) + "\n"
