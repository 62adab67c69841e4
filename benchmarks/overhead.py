"""Host-side cost of one call of a compiled graph (Dynamo guards, AOTAutograd's wrapper, the backend's
wrapper and its kernel launches), eager vs inductor vs ember in one process: a tiny pointwise graph
called many times with no synchronization in between, so the host is the bottleneck.

    python benchmarks/overhead.py [--device cuda] [--calls 3000] [--profile] [--layers]

--profile prints the top functions of ember's calls by own time (cProfile).
--layers splits the compiled call into its layers, each measured the same way: Dynamo alone (a backend
that runs the captured graph's ATen ops, as eager does), Dynamo + AOTAutograd (a compiler that runs the
ATen graph as it is), and ember's compiled graph called directly (its wrapper and launch, no Dynamo nor
AOTAutograd).
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
    ap.add_argument("--layers", action="store_true")
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
    if a.layers:
        res.update(layers(x, a.calls, a.device))
    print(f"host us per call ({a.device}): " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()))


def layers(x, calls, device) -> dict:
    from torch._dynamo.backends.common import aot_autograd
    from torch.fx.experimental.proxy_tensor import make_fx
    out = {}
    torch._dynamo.reset()
    out["dynamo+eager"] = per_call_us(torch.compile(graph, backend=lambda gm, ex: gm.forward), x, calls, device)
    torch._dynamo.reset()
    nop = aot_autograd(fw_compiler=lambda gm, ex: gm, inference_compiler=lambda gm, ex: gm)
    out["dynamo+aot+eager"] = per_call_us(torch.compile(graph, backend=nop), x, calls, device)
    compiled = ember.compile_graph(make_fx(graph)(x), [x])
    out["ember wrapper alone"] = per_call_us(lambda t: compiled([t]), x, calls, device)
    return out


if __name__ == "__main__":
    main()
