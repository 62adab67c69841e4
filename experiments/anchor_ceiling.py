"""The most any torch.compile backend can score on the wall-clock anchor (needs a CUDA GPU):
    python -m experiments.anchor_ceiling PATH/TO/anchor_kernels.py

For each case of the anchor, a stand-in with the case's byte count and the fewest host steps a compiled
graph can take: Dynamo with a backend that returns the graph as traced (no AOTAutograd, no wrapper), whose
graph is one `clone` of a tensor holding half the case's bytes (read once, written once: one allocation,
one launch of PyTorch's own copy kernel). Timed with the anchor's own `bench` (events around one call, the
GPU idle before it), it prints the % of copy the stand-in reaches, next to eager's clone, the GPU idle time
inside the span (`gap` = wall - the copy kernel's time) and the % a backend would reach whose kernel runs
at 100% or 110% of copy with that gap. A bar above the ceiling cannot be met by any backend on this host."""
import argparse
import importlib.util

import torch

from benchmarks.kernels import device_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("anchor", a.anchor)
    anchor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchor)
    x = torch.empty(2 ** 31 // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    roof = 2 * x.numel() * 4 / anchor.bench(lambda: y.copy_(x), ()) / 1e6
    del x, y
    print(f"copy roofline: {roof:.0f} GB/s")
    print(f"{'case':24} {'MB':>6} {'eager clone':>12} {'dynamo clone':>13} {'gap us':>7} "
          f"{'ceil@100%':>10} {'ceil@110%':>10}")
    for name, _, mkargs, nbytes in anchor.cases("cuda"):
        nb = nbytes(mkargs())
        src = torch.randn(nb // 8, device="cuda")           # float32: nb/2 bytes read, nb/2 written
        torch._dynamo.reset()
        f = torch.compile(lambda s: s.clone(), backend=lambda gm, example_inputs: gm.forward)
        f(src)
        pct = {}
        for label, fn in (("eager", lambda s: s.clone()), ("dynamo", f)):
            ms = anchor.bench(fn, (src,))
            pct[label] = 100 * nb / ms / 1e6 / roof
            if label == "dynamo":
                gap_ms = ms - device_ms(lambda: f(src))
        ideal_ms = nb / roof / 1e6
        ceil = [100 * ideal_ms / (ideal_ms / k + gap_ms) for k in (1.0, 1.1)]
        print(f"{name:24} {nb / 1e6:6.0f} {pct['eager']:11.0f}% {pct['dynamo']:12.0f}% {gap_ms * 1e3:7.1f} "
              f"{ceil[0]:9.0f}% {ceil[1]:9.0f}%", flush=True)
        del src


if __name__ == "__main__":
    main()
