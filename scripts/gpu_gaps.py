"""Where the GPU waits during a benchmarks/models.py step: the profiler's trace of a few back-to-back steps,
the GPU's busy time against the span, and the longest idle gaps with the GPU work on either side:
    python scripts/gpu_gaps.py gpt2 infer inductor,ember [--steps 5] [--top 15]
A step whose wall time exceeds both its host time (scripts/host_profile.py) and its kernel time
(scripts/profile_model.py) has the GPU waiting on something other than launches; the gaps name it.
"""
import json, os, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, ember  # noqa: F401  (registers the backend)
import benchmarks.models as M
from torch.profiler import profile, ProfilerActivity

GPU_CATEGORIES = {"kernel", "gpu_memset", "gpu_memcpy"}


def gaps(trace_path: str, top: int) -> None:
    events = json.load(open(trace_path))["traceEvents"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    if not gpu:
        print("  no GPU events")
        return
    busy = sum(e["dur"] for e in gpu)
    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
    print(f"  GPU busy {busy / 1e3:.3f} ms of a {span / 1e3:.3f} ms span ({len(gpu)} GPU ops)")
    idle = []
    for prev, nxt in zip(gpu, gpu[1:]):
        g = nxt["ts"] - (prev["ts"] + prev["dur"])
        if g > 0:
            idle.append((g, prev["name"][:60], nxt["name"][:60]))
    idle.sort(reverse=True)
    print(f"  idle {sum(g for g, *_ in idle) / 1e3:.3f} ms; longest gaps (us, after -> before):")
    for g, a, b in idle[:top]:
        print(f"    {g:9.1f}  {a}  ->  {b}")


def main():
    a = M.probe_arguments(steps=5, top=15)
    init, inp = M.model_and_inputs(a.model, a.mode)
    for be in a.backends.split(","):
        step = M.warm_step(init, inp, a.mode, be)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        print(f"=== {a.model} {a.mode} {be}, {a.steps} steps")
        gaps(path, a.top)


if __name__ == "__main__":
    main()
