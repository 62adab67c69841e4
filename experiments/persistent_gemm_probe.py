"""GEMM kernel shapes against cuBLAS on the GEMM anchor's products (GPU): one program per output tile (the
shape of ember's template), a persistent grid (one program per SM walking tiles) with pointer loads, and a
persistent grid fed by tensor descriptors (TMA), each with the anchor case's epilogue computed on the tile.

    python -m experiments.persistent_gemm_probe [--cases gpt2_fc_bias_gelu,...] [--out results.json]

Each kernel is timed as the anchor times a case (10 back-to-back calls between two events, median of 20
samples), checked against the float32 result, beside eager (cuBLAS plus its epilogue kernel) and cuBLAS's
product alone.
"""
from __future__ import annotations

import argparse
import json
import math

import torch
import triton
import triton.language as tl

from ember.runtime.autotune import median_ms

F = torch.nn.functional

# name: (M, N, K, epilogue), the anchor's cases
CASES = {
    "gpt2_qkv_bias": (8192, 2304, 768, "bias"),
    "gpt2_fc_bias_gelu": (8192, 3072, 768, "bias_gelu"),
    "gpt2_proj_bias_residual": (8192, 768, 3072, "bias_residual"),
    "llama_q": (8192, 1024, 1024, "none"),
    "llama_gate_up_silu_mul": (8192, 2816, 1024, "swiglu"),
    "llama_down_residual": (8192, 1024, 2816, "residual"),
    "square_4096": (4096, 4096, 4096, "none"),
}
# epilogue codes the kernels branch on
EPI = {"none": 0, "bias": 1, "bias_gelu": 2, "bias_gelu_approx": 3, "bias_residual": 4, "residual": 5,
       "bias_gelu_sigmoid": 6, "bias_gelu_div": 7, "bias_gelu_fastdiv": 8, "bias_gelu_erf": 9}
# tanh-GELU spelled as 0.5 x (1 + tanh(u)) with libdevice's tanh (2) or PTX's tanh.approx (3); as
# x * sigmoid(2u), the same function (6); as x / (1 + exp(-2u)) with IEEE (7) or fast (8) division; and
# exact GELU through libdevice's erf (9)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 4),
         (128, 128, 64, 8, 4), (256, 128, 64, 8, 3)]


@triton.jit
def _tanh_approx(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _epilogue(acc, rm, rn, c_ptr, bias_ptr, res_ptr, M: tl.constexpr, N: tl.constexpr, EPI: tl.constexpr):
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    x = acc.to(tl.bfloat16).to(tl.float32)
    if EPI == 1 or EPI == 2 or EPI == 3 or EPI == 4 or EPI >= 6:
        bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        x = (x + bias[None, :]).to(tl.bfloat16).to(tl.float32)
    if EPI == 2 or EPI == 3 or EPI == 6 or EPI == 7 or EPI == 8:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        if EPI == 2:
            x = 0.5 * x * (1.0 + tl.extra.cuda.libdevice.tanh(inner))
        elif EPI == 3:
            x = 0.5 * x * (1.0 + _tanh_approx(inner))
        elif EPI == 6:
            x = x * tl.sigmoid(2.0 * inner)
        elif EPI == 7:
            x = x / (1.0 + tl.exp(-2.0 * inner))
        else:
            x = tl.extra.cuda.libdevice.fast_dividef(x, 1.0 + tl.exp(-2.0 * inner))
    if EPI == 9:
        x = 0.5 * x * (1.0 + tl.extra.cuda.libdevice.erf(x * 0.7071067811865476))
    if EPI == 4 or EPI == 5:
        res = tl.load(res_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        x = res + x
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], x.to(tl.bfloat16), mask=mask)


@triton.jit
def _tile_position(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    pids_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // pids_in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % pids_in_group) % group_rows
    pid_n = (tile % pids_in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def tile_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                EPI: tl.constexpr):
    """One program per output tile: ember's template as generated today."""
    pid_m, pid_n = _tile_position(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rm % M)[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] + (rn % N)[None, :] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    _epilogue(acc, rm, rn, c_ptr, bias_ptr, res_ptr, M, N, EPI)


@triton.jit
def persistent_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, M: tl.constexpr, N: tl.constexpr,
                      K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EPI: tl.constexpr, NUM_SMS: tl.constexpr, TMA: tl.constexpr,
                      FLATTEN: tl.constexpr, WS: tl.constexpr):
    """NUM_SMS programs, each walking tiles NUM_SMS apart; operands through pointers or tensor descriptors."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if TMA:
            for ki in range(0, K // BLOCK_K):
                a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
                b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
        else:
            rk = tl.arange(0, BLOCK_K)
            a_ptrs = a_ptr + (rm % M)[:, None] * K + rk[None, :]
            b_ptrs = b_ptr + rk[:, None] + (rn % N)[None, :] * K
            for ki in range(0, K // BLOCK_K):
                acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
                a_ptrs += BLOCK_K
                b_ptrs += BLOCK_K
        _epilogue(acc, rm, rn, c_ptr, bias_ptr, res_ptr, M, N, EPI)


def bench_us(f) -> float:
    """us per call: the median of 20 samples of 10 back-to-back calls (ember's autotuning timer)."""
    return median_ms(f, samples=20) * 1e3


def eager_fn(epi: str):
    if epi == "none":
        return lambda x, w, b, r: x @ w.t()
    if epi == "bias":
        return lambda x, w, b, r: F.linear(x, w, b)
    if epi == "bias_gelu_erf":
        return lambda x, w, b, r: F.gelu(F.linear(x, w, b))
    if epi.startswith("bias_gelu"):
        return lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh")
    if epi == "bias_residual":
        return lambda x, w, b, r: r + F.linear(x, w, b)
    if epi == "residual":
        return lambda x, w, b, r: r + x @ w.t()
    raise KeyError(epi)


def variants(n_sms: int, k: int, epi: str):
    """(label, kernel, grid kind, constexprs) of every kernel tried on one case: each tile one program per
    tile and persistent (pointer loads, tensor descriptors); the first two tiles also with the tile loop
    not flattened and warp-specialized."""
    out = []
    for i, (bm, bn, bk, warps, stages) in enumerate(TILES):
        if k % bk:
            continue
        base = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
        tag = f"{bm}x{bn}x{bk} w{warps} s{stages}"
        kinds = [("ptr flat", False, True, False), ("tma flat", True, True, False)]
        if i < 2:
            kinds += [("tma nested", True, False, False), ("tma ws", True, False, True)]
        out.append((f"tile {tag}", tile_kernel, "tiles", base))
        out += [(f"persistent {kind} {tag}", persistent_kernel, "sms",
                 dict(base, NUM_SMS=n_sms, TMA=tma, FLATTEN=flat, WS=ws)) for kind, tma, flat, ws in kinds]
    return out


def precompile(tried, args, epi_code: int, n_sms: int) -> None:
    """Compile every variant in threads first (ptxas runs as a process of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        _, kernel, grid_kind, meta = item
        try:
            kernel.warmup(*args, EPI=epi_code, grid=(1,), **meta)
        except Exception:         # noqa: BLE001 - reported when the variant is launched
            pass
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, tried))


def run_case(name: str, epi_override: str | None = None) -> list[dict]:
    m, n, k, epi = CASES[name]
    epi = epi_override or epi
    if epi == "swiglu":     # the probe's kernels have no split epilogue: time the product with a bias
        epi = "bias"
    torch.manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16) / 8  # noqa: E731
    x, w, b, res = r(m, k), r(n, k), r(n), r(m, n)
    ref = eager_fn(epi)(x.float(), w.float(), b.float(), res.float())
    eager = eager_fn(epi)
    rows = [dict(case=name, epilogue=epi, kernel="eager", us=bench_us(lambda: eager(x, w, b, res))),
            dict(case=name, epilogue=epi, kernel="cuBLAS product alone", us=bench_us(lambda: x @ w.t()))]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    tried = variants(n_sms, k, epi)
    precompile(tried, (x, w, out, b, res, m, n, k), EPI[epi], n_sms)
    for label, kernel, grid_kind, meta in tried:
        tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
        grid = (tiles,) if grid_kind == "tiles" else (min(n_sms, tiles),)
        if grid_kind == "sms":
            meta = dict(meta, NUM_SMS=grid[0])
        launch = lambda: kernel[grid](x, w, out, b, res, m, n, k, EPI=EPI[epi], **meta)  # noqa: E731
        try:
            launch()
            torch.cuda.synchronize()
            diff = (out.float() - ref).abs()
            err = diff.max().item() / max(ref.abs().max().item(), 1e-6)
            elem = (diff / (ref.abs() + 1e-2)).max().item()
            us = bench_us(launch)
        except Exception as e:        # noqa: BLE001 - a variant this Triton cannot build is reported, not fatal
            rows.append(dict(case=name, epilogue=epi, kernel=label, error=f"{type(e).__name__}: {str(e)[:160]}"))
            print(f"{name:26s} {label:44s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        rows.append(dict(case=name, epilogue=epi, kernel=label, us=us, rel_err=err, elem_err=elem))
    flops = 2 * m * n * k
    for row in rows:
        if "us" in row:
            row["tflops"] = flops / row["us"] / 1e6
    best = sorted((r for r in rows if "us" in r and r["kernel"] not in ("eager",)), key=lambda r: r["us"])
    for row in rows[:2] + best[:8]:
        print(f"{name:26s} {epi:18s} {row['kernel']:44s} {row['us']:8.1f} us {row['tflops']:6.0f} TFLOP/s"
              f"  err {row.get('rel_err', 0):.1e} / {row.get('elem_err', 0):.1e}", flush=True)
    bad = [r for r in rows if r.get("rel_err", 0) > 2e-2 or (isinstance(r.get("rel_err"), float) and math.isnan(r["rel_err"]))]
    for row in bad:
        print(f"  WRONG: {row['kernel']} rel err {row['rel_err']:.2e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--epilogues", default=None, help="epilogues to try on every case instead of its own")
    ap.add_argument("--tiles", default=None, help="indices into TILES to try (default: all)")
    args = ap.parse_args()
    # tensor descriptors made on the device need a global scratch area from this allocator
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    rows = []
    if args.tiles:
        TILES[:] = [TILES[int(i)] for i in args.tiles.split(",")]
    for name in args.cases.split(","):
        for epi in (args.epilogues.split(",") if args.epilogues else [None]):
            rows += run_case(name, epi)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
