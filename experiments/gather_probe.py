"""On a GPU: anchor models' training steps (anchor_models.py's configs, bf16 autocast, mean-square loss) under
ember with eligible kernels gathered before they are combined (schedule/combine.py, `gather_combinable`) and
without, both compiled in one process and timed in turn: median step (CUDA events), host-only time of a
step (until its last call returns, no sync inside), kernel launches per step (profiler) and peak memory.

    python -m experiments.gather_probe [--models bert_base,gpt2,llama_small] [--rounds 5]

ANCHOR_MODELS: the path of anchor_models.py (default ../shared/bench/anchor_models.py). The graph cache is
off in this process (both variants compile the same graphs). PROBE_HOST_TABLE=1 prints each variant's
operators and runtime calls with the most host time over one step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import ember
from experiments.anchor_module import anchor  # noqa: F401  (probes import it from here)


def _step_fn(am, model, inputs, tag: str):
    """A training step whose frame is a code object of its own (Dynamo compiles each separately)."""
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = am.first_tensor(model(*inputs)).float().pow(2).mean()
        loss.backward()
    step.__code__ = step.__code__.replace(co_name=f"step_{tag}")
    return torch.compile(step, backend="ember")


def _compile(fn, gather: bool) -> dict:
    """The first call of `fn` with gathering on or off; ember's counters of its compile."""
    graph_module = sys.modules["ember.compile_graph"]
    original = graph_module.gather_combinable
    if not gather:
        graph_module.gather_combinable = lambda groups, nbytes: groups
    ember.metrics.reset()
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        graph_module.gather_combinable = original
    return {"kernels": ember.metrics.generated_kernel_count, "combined": ember.metrics.combined_kernels,
            "parts": ember.metrics.combined_kernel_parts}


def timed_in_turn(fns: dict, rounds: int, steps: int = 10) -> dict:
    """{name: [ms of each step]}: `rounds` rounds, each running every fn `steps` times in turn, each step
    between two CUDA events after a sync."""
    ms: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(steps):
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                ms[name].append(s.elapsed_time(e))
    return ms


def launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _host_table(fn) -> str:
    """One step under the profiler (CPU and CUDA): the operators and runtime calls with the most self CPU
    time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60)


def run(am, name: str, rounds: int, plain_first: bool = False) -> dict:
    torch.manual_seed(0)
    model, inputs = am.build(name, "train", "cuda")
    model = model.cuda().train()
    order = ["not gathered", "gathered"] if plain_first else ["gathered", "not gathered"]
    variants = {v: _step_fn(am, model, inputs, v.replace(" ", "_")) for v in order}
    result = {v: {"compile": _compile(fn, v == "gathered")} for v, fn in variants.items()}
    for v, fn in variants.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        result[v]["peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
        result[v]["launches"] = launches(fn)
        if os.environ.get("PROBE_HOST_TABLE"):
            print(f"== {name} {v}\n{_host_table(fn)}", flush=True)
        result[v]["ms"], result[v]["host ms"] = [], []
    for _ in range(rounds):
        for v, fn in variants.items():
            for _ in range(10):
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                s.record()
                fn()
                host = time.perf_counter() - t0
                e.record()
                torch.cuda.synchronize()
                result[v]["ms"].append(s.elapsed_time(e))
                result[v]["host ms"].append(host * 1e3)
    for v in variants:
        for k in ("ms", "host ms"):
            result[v][k] = statistics.median(result[v][k])
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert_base,gpt2,llama_small")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--plain-first", action="store_true", help="compile and time the variant without gathering first")
    a = p.parse_args(argv)
    am = anchor()
    ember.config.graph_cache = False        # the second variant's graph is the first's: compile it again
    torch._dynamo.config.cache_size_limit = 64
    for name in a.models.split(","):
        r = run(am, name, a.rounds, a.plain_first)
        print(json.dumps({"model": name, **r}), flush=True)
        for v, row in r.items():
            print(f"{name:12s} {v:13s} step {row['ms']:7.2f} ms  host {row['host ms']:7.2f} ms  "
                  f"launches {row['launches']:5d}  peak {row['peak GiB']:.2f} GiB  {row['compile']}", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
