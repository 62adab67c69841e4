"""Host-side cost of one call of a compiled graph (Dynamo guards, AOTAutograd's wrapper, the backend's
wrapper and its kernel launches), eager vs inductor vs ember in one process: a tiny pointwise graph
called many times with no synchronization in between, so the host is the bottleneck.

    python benchmarks/overhead.py [--device cuda] [--calls 3000] [--profile]

--profile prints the top functions of ember's calls by own time (cProfile).
"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # ember from this checkout
import ember  # noqa: E402,F401


def graph(x):
    return (x * 2 + 1).sin()


def per_call_us(f, x, calls, device) -> float:
    for _ in range(50):
        f(x)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        f(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    x = torch.randn(1024, device=a.device)
    res = {}
    for backend in ("eager", "inductor", "ember"):
        torch._dynamo.reset()
        f = graph if backend == "eager" else torch.compile(graph, backend=backend)
        torch.testing.assert_close(f(x), graph(x))
        res[backend] = per_call_us(f, x, a.calls, a.device)
        if backend == "ember" and a.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                f(x)
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
            print(out.getvalue())
    print(f"host us per call ({a.device}): " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
