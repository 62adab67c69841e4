"""Host-side cost of one call of a compiled graph (Dynamo's frame and guards, AOTAutograd's wrapper, the
backend's wrapper and its kernel launches), eager vs inductor vs ember in one process: a tiny pointwise
graph (or, with --graph matmul, a tiny matrix product with a bias: a library call) called many times with
no synchronization in between, so the host is the bottleneck. --mode compiles both backends in that
torch.compile mode (reduce-overhead: CUDA graphs' replay).

    python -m benchmarks.overhead [--device cuda] [--calls 500] [--rounds 20] [--profile] [--layers]
                                  [--graph pointwise|matmul] [--mode MODE]

Every variant is compiled once (each from its own copy of the graph's code, so Dynamo keeps them all) and
the variants are timed in turn, round after round; a variant's figure is its best round (this box's and
the GPU hosts' timings drift by 2x between runs, and interleaving keeps the comparison fair).
--layers adds: Dynamo with a backend that does nothing (returns a ready output: the floor under any
torch.compile backend), ember through AOTAutograd's runtime wrapper (config.direct_inference_call off),
and ember's compiled graph called directly (its wrapper and launch, no Dynamo nor AOTAutograd).
--profile prints the top functions of ember's calls by own time (cProfile).
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

import ember  # noqa: F401  (registers the backend)

GRAPHS = {"pointwise": "def graph(x):\n    return (x * 2 + 1).sin()\n",
          "matmul": "def graph(x):\n    return x @ x.t() + 1\n"}
GRAPH = GRAPHS["pointwise"]


def fresh_graph():
    """A new copy of the graph function with its own code object (Dynamo caches compiled code per code
    object, so each variant keeps its own)."""
    scope: dict = {}
    exec(compile(GRAPH, f"<graph {fresh_graph.n}>", "exec"), scope)
    fresh_graph.n += 1
    return scope["graph"]


fresh_graph.n = 0


def per_call_us(variants: dict, x, calls: int, rounds: int, device: str) -> dict:
    best = {k: float("inf") for k in variants}
    for f in variants.values():
        for _ in range(20):
            f(x)
    for _ in range(rounds):
        for k, f in variants.items():
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                f(x)
            if device == "cuda":
                torch.cuda.synchronize()
            best[k] = min(best[k], (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--graph", choices=sorted(GRAPHS), default="pointwise")
    ap.add_argument("--mode", default=None, help="torch.compile's mode for inductor and ember")
    a = ap.parse_args()
    global GRAPH
    GRAPH = GRAPHS[a.graph]
    x = torch.randn(1024, device=a.device) if a.graph == "pointwise" else torch.randn(32, 32, device=a.device)
    reference = fresh_graph()(x)
    variants = {"eager": fresh_graph()}
    for backend in ("inductor", "ember"):
        variants[backend] = torch.compile(fresh_graph(), backend=backend, mode=a.mode)
    if a.layers:
        variants.update(layers(x))
    for name, f in variants.items():
        if name != "dynamo floor":
            torch.testing.assert_close(f(x), reference, msg=lambda m: f"{name}: {m}")
    res = per_call_us(variants, x, a.calls, a.rounds, a.device)
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls * 10):
            variants["ember"](x)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())
    print(f"host us per call ({a.device}): " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()))


def layers(x) -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx
    ready = (torch.empty_like(x),)

    def nothing(gm, example_inputs):
        return lambda *args: ready
    out = {"dynamo floor": torch.compile(fresh_graph(), backend=nothing)}
    with ember.config.patch(direct_inference_call=False):
        out["ember via AOT wrapper"] = torch.compile(fresh_graph(), backend="ember")
        out["ember via AOT wrapper"](x)          # compiled now, while the switch is off
    compiled = ember.compile_graph(make_fx(fresh_graph())(x), [x])
    out["ember graph alone"] = lambda t: compiled([t])[0]
    return out


if __name__ == "__main__":
    main()
