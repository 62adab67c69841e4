"""Block sizes and warps for a kernel, from its shape: one heuristic choice (`launch_config`), and a few
candidates around it that the autotuner times on the GPU (`candidate_configs`)."""
from __future__ import annotations

import dataclasses

from ...ir.symbolic import expand_index, hint, is_static
from ...schedule.nodes import RINDEX, canonical


# Scans whose scanned dim fits this many elements hold it whole (one tl.associative_scan per row); longer
# ones loop over chunks. The scan keeps a few temporaries per element, so this is below reductions' limit.
PERSISTENT_SCAN_MAX = 1024
# elements of one program's block in a persistent scan
SCAN_BLOCK_MAX = 8192
# elements of one program's block in a persistent reduction along a strided dim: such a block is at least 32
# columns wide (coalesced loads), so it holds 32 whole rows; at 16 warps this is 32 values per thread, and
# longer rows (32 x 16384 was possible) would spill registers
PERSISTENT_COLUMN_BLOCK_MAX = 16384


def persistent_row_limit(kernel, limit: int) -> int:
    """The longest row `kernel` may hold whole in registers: `limit` (config.persistent_reduction_max) when
    its loads walk rows contiguously (a row per program), less when it reduces along a static strided dim.
    A symbolic row keeps `limit`, so one compile serves every length up to it (a guard): at launch its
    block takes fewer columns instead (persistent_config)."""
    if not is_static(kernel.R) or _reads_rows_contiguously(kernel):
        return limit
    return min(limit, max(1, PERSISTENT_COLUMN_BLOCK_MAX // _columns(max(1, hint(kernel.X)))))


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _columns(X: int) -> int:
    """Columns a block of a reduction along a strided dim takes: 32 (128 coalesced bytes of float32), or
    all of them when there are fewer."""
    return min(32, next_pow2(X))


def needs_int64(nodes, graph) -> bool:
    """Index arithmetic in int64 when any tensor the kernel touches spans 2**31 elements or more."""
    names = set().union(*(n.reads | n.writes for n in nodes))
    for name in names:
        try:
            buf = graph.get_buffer(name)
            if hint(buf.layout.storage_size()) >= 2 ** 31 - 1:
                return True
        except Exception:
            continue
    for n in nodes:
        x, r = n.group()
        if hint(x) * hint(r) >= 2 ** 31 - 1:
            return True
    return False


# A large pointwise kernel computing exp, erf, sin, ... (ops the op table calls transcendental: the kernel
# is math_heavy) on 16-bit floats is bound by its arithmetic as much as by memory: 16 elements per thread
# (4096 at 8 warps, two 16-byte loads of each input) run add+GELU(erf) in bf16 faster than 8 (1024 at 4
# warps). In float32 the same change makes sin/cos chains slower (benchmarks/kernels.py chain_f32), and
# plain adds stream as fast with either (docs/performance.md, "add+GELU is bound by erf's arithmetic").
MATH_HEAVY_MIN_ELEMENTS = 1 << 22


def _widest_element(kernel) -> int:
    """Bytes of the widest element among the buffers a kernel reads or writes."""
    sizes = [kernel.graph.get_dtype(buf).itemsize for _, buf in kernel.args.call_order()]
    return max(sizes, default=4)


def launch_config(kernel) -> dict:
    X = max(1, hint(kernel.X))
    if not kernel.has_rdim:
        if kernel.math_heavy and X >= MATH_HEAVY_MIN_ELEMENTS and _widest_element(kernel) <= 2:
            return {"XBLOCK": 4096, "num_warps": 8}
        xblock = min(1024, next_pow2(X))
        warps = 4 if xblock >= 512 else (2 if xblock >= 128 else 1)
        return {"XBLOCK": xblock, "num_warps": warps}
    R = max(1, hint(kernel.R))
    if kernel.tiled:
        return {"XBLOCK": min(64, next_pow2(X)), "RBLOCK": min(64, next_pow2(R)), "num_warps": 4}
    if kernel.persistent:
        return persistent_config(X, next_pow2(R), _reads_rows_contiguously(kernel), kernel.has_scan)
    if _reads_rows_contiguously(kernel):
        rblock = min(2048, next_pow2(R))
        return {"XBLOCK": 1, "RBLOCK": rblock, "num_warps": 8 if rblock >= 1024 else 4, "RSTAGES": 1}
    return _looped_column_config(X, R, *LOOPED_COLUMN_CONFIGS[0])


# The configs timed against the heuristic's (below) for a reduction along a strided dim: over the six anchor
# models' steps (inference and training, H100), these three beside it came within 0.12 ms, summed over all
# twelve steps, of timing six; each candidate is a compile (`python -m experiments.tuning_choice_probe`)
TUNED_COLUMN_CONFIGS = ((8, 512, 8), (16, 128, 4), (32, 256, 8))
# Launch configs of a reduction that loops along a strided dim, (columns, rows, warps) per program, the
# heuristic's first. Few columns and many rows per step run much closer to copy than (64, 32, 8) on column
# sums, LayerNorm-style weight gradients and column softmax (docs/performance.md, "Strided (column) reductions
# need their own launch configs"; `python -m experiments.column_reduction_probe`): a program per 16 columns
# keeps 4x more programs in flight, and 4096 elements a step keep each one's loads long enough.
LOOPED_COLUMN_CONFIGS = ((16, 256, 8),) + TUNED_COLUMN_CONFIGS
# Not timed for a strided Welford reduction (var_mean): it never won there on the six anchor models' steps
# (H200, ResNet-50 BatchNorm statistics within 1% of another candidate, ViT's LayerNorm over a convolution's
# channels the slowest of the four), and it is the slowest compile ember sends: 1.7 s, the critical path of
# ViT-B/16's cold first call, where the other candidates take 1.0 s (`python -m experiments.tuning_choice_probe`,
# `python -m experiments.compile_pool_timeline vit_b16 infer`)
SLOW_WELFORD_COLUMN_CONFIG = (32, 256, 8)
# Never launched for a strided reduction, even where a short row clamps (64, 64, 8) to it: ConvNeXt's
# LayerNorm weight gradients (a strided reduction that also reads a tile contiguous along rindex) fault
# with "misaligned address" there under Triton 3.6 on H100 and H200 GPUs, reproduced standalone by
# experiments/triton_misaligned_repro.py; every other config we time runs and is right. A CUDA fault ends the
# process, so the autotuner cannot just skip it.
FAULTING_COLUMN_CONFIG = (64, 32, 8)


def _looped_column_config(X: int, R: int, xblock: int, rblock: int, warps: int) -> dict:
    xblock, rblock = min(xblock, next_pow2(X)), min(rblock, next_pow2(R))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps if xblock * rblock >= 128 * warps else 4,
            "RSTAGES": 1}


def persistent_config(X: int, rblock: int, contiguous: bool, scan: bool) -> dict:
    """Whole rows in registers (RBLOCK >= the row): several short rows per program, one long row per program."""
    xblock = max(1, min(next_pow2(X), 4096 // rblock, 64))
    if not contiguous:
        xblock = max(xblock, _columns(X))
        # a symbolic column row longer than kernel.py's static cap: fewer columns, not spilled registers
        xblock = min(xblock, max(1, PERSISTENT_COLUMN_BLOCK_MAX // rblock))
    if scan:
        xblock = min(xblock, max(1, SCAN_BLOCK_MAX // rblock))
    n = xblock * rblock
    warps = 2 if n <= 512 else 4 if n <= 2048 else 8 if n <= 8192 else 16
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps}


def _read_indices(kernel) -> list:
    """Each load's index in the kernel's (xindex, rindex) terms, expanded; worked out once per kernel (the
    heuristics below ask several times while a kernel is generated and tuned)."""
    cached = kernel.__dict__.get("_heuristics_read_indices")
    if cached is None:
        cached = [expand_index(canonical(d.index, n.flat_vars(kernel.group), kernel.group))
                  for n in kernel.nodes for d in n.read_deps]
        kernel.__dict__["_heuristics_read_indices"] = cached
    return cached


def _reads_rows_contiguously(kernel) -> bool:
    """Do the kernel's loads walk memory along rindex (stride 1)? Then rows go one per program."""
    for e in _read_indices(kernel):
        if RINDEX in e.free_symbols:
            return e.coeff(RINDEX) == 1
    return True


# Below this many elements a kernel is bound by its launch, not its config: tuning it only costs compiles.
TUNE_MIN_ELEMENTS = 1 << 20


def candidate_configs(kernel, best: dict) -> list[dict]:
    """Launch configs worth timing for this kernel, `best` (the heuristic's) first; [best] alone when the
    kernel is too small for the choice to matter. A handful only: each candidate is one Triton compile."""
    X = max(1, hint(kernel.X))
    R = max(1, hint(kernel.R)) if kernel.has_rdim else 1
    if X * R < TUNE_MIN_ELEMENTS or not kernel.has_rdim:
        # pointwise kernels stream at the bandwidth roofline with the heuristic's blocks: tuning them
        # measured no gain and cost a Triton compile per candidate
        return [best]
    if kernel.tiled:
        cands = [{"XBLOCK": xb, "RBLOCK": rb, "num_warps": w}
                 for xb, rb, w in ((32, 32, 4), (64, 64, 4), (64, 64, 8), (32, 128, 4), (128, 32, 4))]
    elif kernel.persistent:
        cands = _persistent_candidates(X, best["RBLOCK"], kernel.has_scan)
    elif _reads_rows_contiguously(kernel):
        # (rows, chunk, warps, RSTAGES). Software-pipelined row loops: cross-entropy's row statistics (4096 x
        # 32000 bf16) run faster with three chunks' loads in flight than without, and two stages slower than
        # one (docs/performance.md, "Cross-entropy's statistics read each row once";
        # `python -m experiments.cross_entropy_probe`). Candidates, not the default: the autotuner keeps them
        # where they win.
        shapes = ((1, 4096, 8, 3), (1, 1024, 4, 3), (1, 2048, 8, 3), (1, 4096, 8, 1), (1, 1024, 4, 1),
                  (1, 2048, 8, 1), (2, 1024, 8, 1)) if kernel.loop_pipelinable() else \
            ((1, 1024, 4, 1), (1, 2048, 8, 1), (1, 4096, 8, 1), (1, 4096, 16, 1), (2, 1024, 8, 1), (4, 512, 8, 1))
        cands = [{"XBLOCK": xb, "RBLOCK": rb, "num_warps": w, "RSTAGES": st}
                 for xb, rb, w, st in shapes if rb <= max(next_pow2(R), 1024)]
    else:
        left_out = {FAULTING_COLUMN_CONFIG} | ({SLOW_WELFORD_COLUMN_CONFIG} if _has_welford(kernel) else set())
        cands = [c for c in (_looped_column_config(X, R, *c) for c in TUNED_COLUMN_CONFIGS)
                 if (c["XBLOCK"], c["RBLOCK"], c["num_warps"]) not in left_out]
    return _first_eight(best, cands)


def _has_welford(kernel) -> bool:
    return any(getattr(n.buf.data, "reduction_type", None) == "welford" for n in kernel.nodes if n.is_kernel())


# Persistent reductions' candidates beside the heuristic's: (elements of a program's block, warps). Over the
# six anchor models' steps (H100), these three came within 0.12 ms, summed over all twelve steps, of timing
# blocks of 1 to 32 rows at 256, 512 and 1024 elements per warp (eight candidates a kernel, each a compile;
# `python -m experiments.tuning_choice_probe`). Most winners ran fewer warps than the heuristic gives.
PERSISTENT_TUNED_BLOCKS = ((1024, 1), (1024, 4), (2048, 8))


def _persistent_candidates(X: int, rblock: int, scan: bool) -> list[dict]:
    cands = []
    for n, w in PERSISTENT_TUNED_BLOCKS:
        xb = min(max(1, n // rblock), next_pow2(X))
        if xb * rblock > (SCAN_BLOCK_MAX if scan else 32768):
            continue
        n = xb * rblock
        # at most 1024 elements a warp (longer rows would spill registers), at least one per thread
        cands.append({"XBLOCK": xb, "RBLOCK": rblock, "num_warps": max(1, min(max(w, n // 1024), n // 32, 16))})
    return cands


def _first_eight(best: dict, cands: list) -> list[dict]:
    out = [best]
    for c in cands:
        if c not in out:
            out.append(c)
    return out[:8]


@dataclasses.dataclass(frozen=True)
class RowSizedConfigs:
    """Launch configs of a persistent kernel whose row length is a symbol, for the sizes of a launch: RBLOCK
    is the row's next power of two, so the whole row fits, and XBLOCK / warps follow as for a static row.
    The launcher asks once per power-of-two size class (Triton compiles one binary per RBLOCK)."""
    contiguous: bool       # the kernel's loads walk rows with stride 1
    scan: bool
    tune: bool             # candidates to time, or the heuristic's choice alone

    def __call__(self, xnumel: int, rnumel: int) -> list[dict]:
        X, R = max(1, int(xnumel)), max(1, int(rnumel))
        best = persistent_config(X, next_pow2(R), self.contiguous, self.scan)
        if not self.tune or X * R < TUNE_MIN_ELEMENTS:
            return [best]
        return _first_eight(best, _persistent_candidates(X, best["RBLOCK"], self.scan))


def row_sized_configs(kernel, tune: bool) -> RowSizedConfigs:
    return RowSizedConfigs(_reads_rows_contiguously(kernel), kernel.has_scan, tune)
