"""The `ember` command.

    ember demo [--device cpu|cuda] [--steps N]   compile a small GPT with ember, check it against eager, time it
    ember bench [args of benchmarks/kernels.py]  memory-bound kernel benchmark (eager / inductor / ember)
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# -- the demo model ----------------------------------------------------------------------------------------
# Written out by hand (no nn.MultiheadAttention, no SDPA) so that everything it does goes through ember's
# own lowerings: the softmax, layer norms and GELU become generated kernels; only the matmuls fall back.

class Block(nn.Module):
    def __init__(self, d: int, n_head: int, seq: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, n_head, seq) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.tok.weight)      # LM head tied to the token embedding


# Sizes: the CPU-Triton one must run in seconds through the Triton interpreter, the CUDA one should be big enough
# that kernel time, not launch overhead, is what gets measured.
SIZES = {
    "cpu-triton": dict(vocab=256, d=64, n_layer=2, n_head=4, seq=32, batch=2, dtype=torch.float32),
    "cpu": dict(vocab=2048, d=256, n_layer=4, n_head=4, seq=128, batch=4, dtype=torch.float32),
    "cuda": dict(vocab=8192, d=512, n_layer=4, n_head=8, seq=256, batch=8, dtype=torch.bfloat16),
}
# Tolerance on the logits relative to their largest magnitude: a whole network of bf16 roundings taken
# in a different order drifts by a few ulps of bf16 (2^-8), float32 by far less.
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _timer(device: str):
    """Median milliseconds per call of fn."""
    def run(fn, steps: int) -> float:
        fn()
        times = []
        if device == "cuda":
            torch.cuda.synchronize()
            for _ in range(steps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
        else:
            for _ in range(steps):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    return run


def _kernels_in(path: str) -> list[str]:
    with open(path) as f:
        src = f.read()
    marker = "@triton.jit" if path.endswith(".py") else 'extern "C"'
    parts = src.split(marker)
    return [(marker + p).strip() for p in parts[1:]] or ([src.strip()] if src.strip() else [])


def _largest_kernel(debug_dir: str) -> tuple[str, str]:
    """(graph folder, source) of the longest kernel any compiled graph generated."""
    best = ("", "")
    for path in sorted(glob.glob(os.path.join(debug_dir, "graph_*", "kernels.*"))):
        for k in _kernels_in(path):
            if len(k) > len(best[1]):
                best = (os.path.basename(os.path.dirname(path)), k)
    return best


def demo(args) -> int:
    import ember

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("ember demo: --device cuda asked for, but torch sees no GPU", file=sys.stderr)
        return 2
    size = dict(SIZES["cpu-triton" if device == "cpu" and ember.config.cpu_backend == "triton" else device])
    batch, dtype = size.pop("batch"), size.pop("dtype")
    steps = args.steps or (20 if device == "cuda" else 5)
    torch.manual_seed(0)
    model = TinyGPT(**size).to(device=device, dtype=dtype).eval()
    idx = torch.randint(0, size["vocab"], (batch, size["seq"]), device=device)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"ember demo: GPT with {size['n_layer']} layers, d={size['d']}, {size['n_head']} heads, "
          f"seq {size['seq']}, batch {batch}, vocab {size['vocab']} ({nparams / 1e6:.2f}M params, {dtype}) on {device}")
    if device == "cpu" and ember.config.cpu_backend == "triton":
        print("  note: with cpu_backend='triton' ember runs its Triton kernels in the Triton interpreter, which is\n"
              "  very slow: the timings below show correctness plumbing, not speed.")

    torch._dynamo.reset()
    ember.metrics.reset()
    compiled = torch.compile(model, backend="ember")
    with tempfile.TemporaryDirectory(prefix="ember_demo_") as dbg, torch.no_grad(), \
            ember.config.patch(debug=True, debug_dir=dbg):
        t = time.perf_counter()
        out = compiled(idx)
        if device == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t
        ref = model(idx)
        err = (out.float() - ref.float()).abs().max().item()
        scale = ref.float().abs().max().item()
        tol = REL_TOL.get(dtype, 1e-4) * max(scale, 1.0)
        ok = out.shape == ref.shape and out.dtype == ref.dtype and bool(torch.isfinite(out).all()) and err <= tol
        timer = _timer(device)
        eager_ms = timer(lambda: model(idx), steps)
        ember_ms = timer(lambda: compiled(idx), steps)
        kgraph, ksrc = _largest_kernel(dbg)
        graphs = len(glob.glob(os.path.join(dbg, "graph_*")))

    m = ember.metrics
    print(f"\ncheck vs eager: {'PASS' if ok else 'FAIL'}  (max |ember - eager| = {err:.3g}, "
          f"tolerance {tol:.3g} = {REL_TOL.get(dtype, 1e-4)} x max|logit|)")
    print(f"compile (first call, Dynamo + AOTAutograd + ember + first run): {compile_s:.2f} s")
    print(f"graphs compiled: {m.graphs_compiled} ({graphs} dumped), generated kernels: {m.generated_kernel_count}, "
          f"graphs run eagerly after an ember error: {m.eager_fallbacks}")
    fb = ", ".join(f"{k} x{v}" for k, v in sorted(m.fallbacks.items())) or "none"
    print(f"ATen fallbacks: {fb}")
    print(f"time per call (median of {steps}): eager {eager_ms:.3f} ms, ember {ember_ms:.3f} ms "
          f"(ember/eager = {ember_ms / eager_ms:.2f}x)")
    if device == "cpu" and ember.config.cpu_backend == "triton":
        print("  (ember's CPU time is the Triton interpreter's, see the note above)")
    if ksrc:
        print(f"\nlargest generated kernel ({kgraph}, {len(ksrc.splitlines())} lines):\n")
        print(ksrc)
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def bench(argv: list[str]) -> int:
    import runpy
    # benchmarks/ is not part of the installed package; it is found next to it in a source checkout
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "kernels.py")
    if not os.path.exists(path):
        print(f"ember bench: {path} not found (it lives in ember's source checkout; install with pip -e)",
              file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [path] + argv
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="ember", description="ember, a graph compiler for PyTorch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a small GPT with ember, check it against eager and time it")
    d.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    d.add_argument("--steps", type=int, default=None, help="timed calls per backend (default 5 on CPU, 20 on CUDA)")
    sub.add_parser("bench", help="memory-bound kernel benchmark; arguments go to benchmarks/kernels.py",
                   add_help=False)
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
