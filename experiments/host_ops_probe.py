"""Where a compiled model step's host time goes, per backend, at the ATen level. Needs a CUDA GPU:
    python -m experiments.host_ops_probe MODEL MODE [BACKENDS] [--batch B]
(MODEL, MODE and BACKENDS as scripts/profile_model.py takes them; --batch 64 for the model anchor's images.)
Per backend: host ms per step (back-to-back steps, no sync, after a warm-up) and the operators and CUDA
runtime calls with the most self CPU time per step under torch.profiler (CPU activity only). What the host
spends outside these (Python: the wrapper, launch paths, Dynamo's guards) is the host time minus their sum,
as far as the profiler's own cost per event allows."""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import models as M


def host_ms(step, n: int, device: str = "cuda") -> float:
    """Host ms per step over n back-to-back steps, started and ended on an idle device."""
    M.sync(device)
    t = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t) * 1e3 / n
    M.sync(device)
    return host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=M.MODELS)
    ap.add_argument("mode", choices=["infer", "train"])
    ap.add_argument("backends", nargs="?", default="inductor,ember")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    model, inp = M.model_and_inputs(a.model, a.mode, "cuda", False, a.batch)
    for backend in a.backends.split(","):
        step = M.warm_step(model, inp, a.mode, backend, "cuda")
        host_ms(step, 5)
        host = min(host_ms(step, a.steps) for _ in range(3))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
        rows = sorted(((e.self_cpu_time_total / a.steps, e.count / a.steps, e.key) for e in prof.key_averages()),
                      reverse=True)
        print(f"=== {a.model} {a.mode} {backend}: host {host:.3f} ms per step; profiled self CPU "
              f"{sum(r[0] for r in rows) / 1e3:.3f} ms per step", flush=True)
        for us, n, key in rows[:a.top]:
            print(f"  {us:9.1f} us  x{n:6.1f}  {key[:100]}")


if __name__ == "__main__":
    main()
