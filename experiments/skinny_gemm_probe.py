"""Products with few rows (decode: x [M, K] @ W[N, K]^T, M <= 16), on a GPU: cuBLAS against raw Triton
kernels of two kinds, each over a sweep of launch configs, timed inside a CUDA graph of 50 back-to-back calls
(as a decode step's graph runs them); us per call.
- dot: programs over (N / BLOCK_N) x (M / BLOCK_M) tiles, `tl.dot` over K (rows past M masked);
- rows: M = 1 only, programs over N / BLOCK_N, each row of W times x summed along K (no tensor cores).
Usage: python -m experiments.skinny_gemm_probe [--shapes M,N,K;...] [--cold] [--kinds dot,rows]"""
import argparse
import itertools

import torch
import triton
import triton.language as tl


@triton.jit
def dot_kernel(A, B, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + (rm % M)[:, None] * K + rk[None, :]
    b_ptrs = B + (rn % N)[None, :] * K + rk[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=(rm < M)[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(rm < M)[:, None] & (rk[None, :] < K - k), other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty), (rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def rows_kernel(A, B, C, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(A + k + rk, mask=rk < K - k, other=0.0).to(tl.float32)
        w = tl.load(B + (rn % N)[:, None] * K + k + rk[None, :], mask=(rk < K - k)[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(C + rn, tl.sum(acc, 1).to(C.dtype.element_ty), rn < N)


def graph_us(fn, calls=50, reps=20):
    """us per call of `fn(i)` over calls i = 0..calls-1 in one CUDA graph."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / calls)
    return sorted(ts)[len(ts) // 2]


def probe(m, n, k, cold, kinds=("dot", "rows")):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    # cold: enough copies of W, each call reading the next, that none is in L2 (50 MB) when read again
    copies = -(-160 * 2 ** 20 // (n * k * 2)) if cold else 1
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    w = ws[0]
    ref = (x.float() @ w.float().t())
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    rows = []
    best = {"cublas": (graph_us(lambda i: torch.mm(x, ws[i % copies].t(), out=c)), None)}
    for kind, bn, bk, warps, stages in itertools.product(kinds, (2, 4, 8, 16, 32, 64), (128, 256, 512),
                                                          (2, 4, 8), (1, 2, 4)):
        if kind == "rows" and (m != 1 or stages > 2) or kind == "dot" and stages == 1:
            continue
        if kind == "dot" and bn < 16:
            continue
        cfg = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
        try:
            if kind == "dot":
                bm = max(16, triton.next_power_of_2(m))
                grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
                fn = lambda i: dot_kernel[grid](x, ws[i % copies], c, m, n, k, BLOCK_M=bm, EVEN_K=k % bk == 0, **cfg)
            else:
                grid = (triton.cdiv(n, bn),)
                fn = lambda i: rows_kernel[grid](x, ws[i % copies], c, n, k, **cfg)
            c.zero_()
            fn(0)
            err = ((c.float() - ref).norm() / ref.norm()).item()
            if err > 2e-2:
                print(f"   {kind} {cfg} WRONG {err:.2e}")
                continue
            us = graph_us(fn)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
            print(f"   {kind} {cfg} failed: {type(e).__name__}")
            continue
        if kind not in best or us < best[kind][0]:
            best[kind] = (us, cfg)
        if kind == "rows":
            rows.append((us, bn, bk, warps, stages))
    gb = (n * k + m * k + m * n) * 2 / 1e9
    line = ", ".join(f"{kind} {us:.2f} us ({gb / us * 1e6:.0f} GB/s) {cfg or ''}" for kind, (us, cfg) in best.items())
    print(f"M={m} N={n} K={k}{' cold' if cold else ''}: {line}", flush=True)
    if rows:
        print("   rows (us, BLOCK_N, BLOCK_K, warps, stages), fastest first:",
              ", ".join(f"({us:.2f}, {bn}, {bk}, {w}, {st})" for us, bn, bk, w, st in sorted(rows)[:8]), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,1536,1024;1,1024,1024;1,5632,1024;1,1024,2816;1,32000,1024;"
                                        "16,4096,4096;4,1536,1024;8,5632,1024")
    ap.add_argument("--cold", action="store_true", help="W read from memory at each call, not from L2")
    ap.add_argument("--kinds", default="dot,rows")
    a = ap.parse_args()
    for shape in a.shapes.split(";"):
        probe(*map(int, shape.split(",")), a.cold, tuple(a.kinds.split(",")))
