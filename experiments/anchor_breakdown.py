"""Where the wall-clock anchor's time goes, per case and backend (needs a CUDA GPU):
    python -m experiments.anchor_breakdown PATH/TO/anchor_kernels.py [--backends eager,inductor,ember]

For each case of the anchor (its own `cases()` and its own timing: events around one call, the GPU idle
before it) this prints, in us: `wall` (the anchor's median), `host` (perf_counter around the same call, the
GPU idle before it: until the call returns), `kernels` (GPU time of the kernels one call launches, from the
profiler) and `gap` = wall - kernels (the GPU idle inside the timed span: host time before the first
launch, between launches and after the last)."""
import argparse
import importlib.util
import time

import torch

import ember  # noqa: F401
from benchmarks.kernels import device_ms


def host_us(call, wait=None, iters=50):
    """Median host time of `call()` in us, each call right after a sync (that first waits for `wait()`'s GPU
    work when given)."""
    ts = []
    for _ in range(iters):
        if wait is not None:
            wait()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2] * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor")
    ap.add_argument("--backends", default="eager,inductor,ember")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("anchor", a.anchor)
    anchor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchor)
    print(f"{'case':24} {'backend':9} {'wall':>7} {'host':>7} {'kernels':>8} {'gap':>7}   (us)")
    for name, fn, mkargs, _ in anchor.cases("cuda"):
        args = mkargs()
        for be in a.backends.split(","):
            torch._dynamo.reset()
            f = fn if be == "eager" else torch.compile(fn, backend=be)
            f(*args)
            wall = anchor.bench(f, args) * 1e3
            host = host_us(lambda: f(*args))
            kern = device_ms(lambda: f(*args)) * 1e3
            print(f"{name:24} {be:9} {wall:7.1f} {host:7.1f} {kern:8.1f} {wall - kern:7.1f}", flush=True)


if __name__ == "__main__":
    main()
