"""FlexAttention: ember's kernels against inductor's flex kernels and SDPA's fused kernels (causal only).

    python -m benchmarks.flex_attention [--device cuda] [--quick] [--dims 64,128] [--masks causal,sliding]
    EMBER_CPU_BACKEND=triton python -m benchmarks.flex_attention --device cpu --quick   # a smoke test

bf16 (float32 on the CPU), B=4, H=16, seq 4096 (--quick: B=1, H=2, seq 256; on the CPU seq 64), causal and
sliding-window (window 1024, --quick 64) masks. Per case and backend: forward and forward+backward TFLOP/s
(median over the timed calls) and the largest absolute difference of the output (and gradients) from the
first backend's. FLOP convention: a dense attention's (forward 4*B*H*S*S*D: two products; backward 2.5x that:
five products) times the fraction of (query block, key block) pairs the BlockMask keeps, so masked-out
blocks count as no work and every backend is measured against the same useful work. The CPU has no
backward (torch refuses flex_attention's backward there) and no inductor run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import ember


def _masks(window: int) -> dict:
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)
    return {"causal": causal, "sliding": sliding}


def _density(bm) -> float:
    """Fraction of the (query block, key block) pairs the BlockMask computes."""
    kept = bm.kv_num_blocks.sum() + (bm.full_kv_num_blocks.sum() if bm.full_kv_num_blocks is not None else 0)
    b, h, rows = bm.kv_num_blocks.shape
    return float(kept) / (b * h * rows * bm.kv_indices.shape[-1])


def _timed(fn, device: str, iters: int) -> float:
    """Median seconds per call, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _backends(device: str, mask_name: str) -> dict:
    torch._dynamo.reset()
    out = {}
    if device == "cuda":
        out["inductor flex"] = torch.compile(flex_attention)
    out["ember flex"] = torch.compile(flex_attention, backend="ember")
    if mask_name == "causal":
        # SDPA's own choice on a Hopper GPU is cuDNN's kernel, not flash: each is forced, so that its row
        # measures the kernel it names
        for label, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
            if device == "cuda" or backend == SDPBackend.FLASH_ATTENTION:
                out[label] = _sdpa(backend)
    return out


def _sdpa(backend):
    def run(q, k, v, block_mask):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def run_case(device, dtype, B, H, S, D, mask_name, window, iters, backward: bool) -> list[dict]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=device, dtype=dtype) for _ in range(3))
    dout = torch.randn(B, H, S, D, device=device, dtype=dtype)
    bm = create_block_mask(_masks(window)[mask_name], None, None, S, S, device=device)
    dense = 4.0 * B * H * S * S * D
    density = _density(bm)
    rows, first = [], None
    for name, fn in _backends(device, mask_name).items():
        ember.metrics.reset()
        row = {"case": f"D={D} {mask_name}", "backend": name}
        try:
            with torch.no_grad():
                out = fn(q, k, v, block_mask=bm)
                row["fwd TFLOP/s"] = dense * density / _timed(lambda: fn(q, k, v, block_mask=bm), device, iters) / 1e12
            grads = ()
            if backward:
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

                def step():
                    for t in leaves:
                        t.grad = None
                    fn(*leaves, block_mask=bm).backward(dout)
                step()
                grads = tuple(t.grad.clone() for t in leaves)
                row["fwd+bwd TFLOP/s"] = 3.5 * dense * density / _timed(step, device, iters) / 1e12
        except Exception as e:      # a backend that cannot run the case is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            rows.append(row)
            continue
        if name == "ember flex":
            row["ember flex fallbacks"] = sum(n for op, n in ember.metrics.fallbacks.items() if "flex" in op)
        if first is None:
            first = (out, grads)
        row["max abs err"] = max([(out.float() - first[0].float()).abs().max().item()] +
                                 [(a.float() - b.float()).abs().max().item() for a, b in zip(grads, first[1])])
        rows.append(row)
    return rows


def _print(rows: list[dict]) -> None:
    cols = ["case", "backend", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "max abs err", "ember flex fallbacks", "error"]
    cols = [c for c in cols if any(c in r for r in rows)]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)   # noqa: E731
    table = [cols] + [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="a small smoke size")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--masks", default="causal,sliding")
    p.add_argument("--iters", type=int, default=None)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if args.quick:
        B, H, S, window = 1, 2, 256 if cuda else 64, 64 if cuda else 16
    else:
        B, H, S, window = 4, 16, 4096, 1024
    iters = args.iters or (20 if cuda else 2)
    dims = [int(d) for d in args.dims.split(",")]
    if args.quick and not cuda:
        dims = [min(dims)]
    rows = []
    for D in dims:
        for mask in args.masks.split(","):
            rows += run_case(args.device, dtype, B, H, S, D, mask, window, iters, backward=cuda)
    _print(rows)


if __name__ == "__main__":
    main()
