"""GELU and its backward as memory-bound kernels (GPU): both approximations over 8192x3072 bf16, per backend,
in us per call (10 back-to-back calls, median of 20 samples) and as % of a clone of the input (the
backward moves 1.5 clones' bytes), with the max error against the float32 result.

    python -m experiments.gelu_kernels_probe [eager,inductor,ember]

Finding (2026-11-26, H100, torch 2.11, Triton 3.6; docs/performance.md, "GEMM epilogues"): spelling
GELU's tanh as exp and a division changes these kernels by 1-2%: they run at 92-100% of a clone either way.
"""
from __future__ import annotations

import sys

import torch

from ember.runtime.autotune import median_ms

F = torch.nn.functional


def bench_us(f, *args) -> float:
    """us per call: the median of 20 samples of 10 back-to-back calls (ember's autotuning timer)."""
    return median_ms(lambda: f(*args), samples=20) * 1e3


def main() -> None:
    backends = (sys.argv[1] if len(sys.argv) > 1 else "eager,inductor,ember").split(",")
    x = torch.randn(8192, 3072, device="cuda", dtype=torch.bfloat16) * 2
    g = torch.randn_like(x)
    clone_us = bench_us(torch.clone, x)
    for approx in ("tanh", "none"):
        def forward(a):
            return F.gelu(a, approximate=approx)

        def backward(g, a):
            return torch.ops.aten.gelu_backward(g, a, approximate=approx)
        for name in backends:
            torch._dynamo.reset()
            fwd = forward if name == "eager" else torch.compile(forward, backend=name)
            bwd = backward if name == "eager" else torch.compile(backward, backend=name)
            t_fwd, t_bwd = bench_us(fwd, x), bench_us(bwd, g, x)
            e_fwd = (fwd(x).float() - forward(x.float())).abs().max().item()
            e_bwd = (bwd(g, x).float() - backward(g.float(), x.float())).abs().max().item()
            print(f"gelu {approx:5s} {name:9s} forward {t_fwd:7.1f} us ({clone_us / t_fwd:6.1%} of a clone), "
                  f"backward {t_bwd:7.1f} us ({1.5 * clone_us / t_bwd:6.1%}), max err {e_fwd:.1e} / {e_bwd:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
