"""One step of a benchmark model (benchmarks/models.py), profiled per backend. Run from the repository root:

    python -m scripts.profile_model MODEL MODE [BACKENDS] [--view kernels|host|gaps] [--steps N] [--top N] [--batch B]
    python -m scripts.profile_model mlp train eager,ember --small --device cpu --view host     # a CPU smoke run

MODEL is one of benchmarks.models.MODELS (or `mlp`), MODE `infer` or `train`, BACKENDS a comma list of
eager, inductor, ember (default inductor,ember). Each backend's step is compiled and warmed up first.
Views:
- kernels (default): the top kernels of a step by device time (torch.profiler over --steps steps) with their
  launches per step: where the GPU's time goes.
- host: wall time per step back to back (as the models benchmark times it), the host's own time per step
  (until the last launch returns), and a cProfile of --steps steps: where a host-bound step's time goes.
- gaps: the GPU's busy time against the span of --steps steps and its longest idle gaps, with the GPU work
  on either side: what the GPU waits for when a step's wall time exceeds both its host and its kernel time.
On a CPU, `kernels` lists operators by CPU time and `gaps` has no GPU events to show.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import models as M

GPU_CATEGORIES = {"kernel", "gpu_memset", "gpu_memcpy"}


def activities(device: str) -> list:
    return [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


def kernels_view(step, a) -> None:
    with profile(activities=activities(a.device)) as prof:
        for _ in range(a.steps):
            step()
        M.sync(a.device)
    attr = "self_device_time_total" if a.device == "cuda" else "self_cpu_time_total"
    rows = sorted(((getattr(e, attr) / a.steps, e.count // a.steps, e.key) for e in prof.key_averages()
                   if getattr(e, attr) > 0), reverse=True)
    what = "GPU" if a.device == "cuda" else "CPU (operators)"
    print(f"  {what} {sum(r[0] for r in rows) / 1e3:.3f} ms per step, {sum(r[1] for r in rows)} launches")
    for us, n, key in rows[:a.top]:
        print(f"  {us:9.1f} us  x{n:3}  {key[:110]}")


def host_view(step, a) -> None:
    wall, _ = M.timed_block(step, a.steps, a.device)
    M.sync(a.device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    host = (time.perf_counter() - t0) * 1e3 / a.steps
    M.sync(a.device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    M.sync(a.device)
    prof.disable()
    print(f"  wall {wall:.2f} ms per step, host {host:.2f} ms per step")
    for order in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(order).print_stats(a.top)
        text = s.getvalue()
        print(f"  --- by {order} (cProfile, {a.steps} steps)")
        print(text[text.find("ncalls"):] if "ncalls" in text else text)


def gaps_view(step, a) -> None:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA][:2 if a.device == "cuda" else 1]) as prof:
        for _ in range(a.steps):
            step()
        M.sync(a.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    if not gpu:
        print("  no GPU events")
        return
    busy = sum(e["dur"] for e in gpu)
    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
    print(f"  GPU busy {busy / 1e3:.3f} ms of a {span / 1e3:.3f} ms span ({len(gpu)} GPU ops)")
    idle = sorted(((nxt["ts"] - (prev["ts"] + prev["dur"]), prev["name"][:60], nxt["name"][:60])
                   for prev, nxt in zip(gpu, gpu[1:]) if nxt["ts"] > prev["ts"] + prev["dur"]), reverse=True)
    print(f"  idle {sum(g for g, *_ in idle) / 1e3:.3f} ms; longest gaps (us, after -> before):")
    for g, before, after in idle[:a.top]:
        print(f"    {g:9.1f}  {before}  ->  {after}")


VIEWS = {"kernels": kernels_view, "host": host_view, "gaps": gaps_view}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=M.MODELS + ["mlp"])
    ap.add_argument("mode", choices=["infer", "train"])
    ap.add_argument("backends", nargs="?", default="inductor,ember")
    ap.add_argument("--view", choices=sorted(VIEWS), default="kernels")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="the tiny configs of the CPU smoke runs")
    ap.add_argument("--batch", type=int, help="batch size (default: benchmarks/models.py's; the model anchor "
                    "runs 64 images)")
    a = ap.parse_args(argv)
    model, inp = M.model_and_inputs(a.model, a.mode, a.device, a.small, a.batch)
    for backend in a.backends.split(","):
        step = M.warm_step(model, inp, a.mode, backend, a.device)
        print(f"=== {a.model} {a.mode} {backend}, {a.view}, {a.steps} steps", flush=True)
        VIEWS[a.view](step, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
