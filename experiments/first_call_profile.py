"""Where a first call's seconds go: one anchor model's step (../shared/bench/anchor_models.py's `build`,
bf16 inference or bf16-autocast training as the anchor runs them), compiled with BACKEND (ember, inductor,
aot_eager, eager: Dynamo alone), its first call under cProfile.

    python -m experiments.first_call_profile ANCHOR_MODELS BACKEND MODEL:MODE OUT [--cold-then-warm]

Writes OUT.json (first call seconds, ember's compile seconds and cache counters, Dynamo's compile-time
table) and OUT.prof (pstats); for ember also the compile workers' jobs and errors per kernel module. With --cold-then-warm the case runs twice in fresh processes sharing fresh
cache directories (ember's, inductor's, Triton's): a cold start, a warm one, and a warm one under cProfile (OUT.cold,
OUT.warm, OUT.warm_profiled; PROBE_PHASES=cold,warm,warm2 names others: a name ending in _profiled is
profiled; one ending in _sampled has its main thread's stack sampled (OUT.folded,
experiments/main_thread_sampler.py); one naming noworkers starts no compile workers; one ending in _jit first empties the compile pool's markers, so that its kernels load through
Triton's JIT rather than from the workers' binaries; one naming nodriverahead builds Triton's driver at its first use rather than
on a thread from Dynamo's start, runtime/triton_driver.py). PROBE_PROFILE=0 turns the profile off. `python -m experiments.first_call_profile --show OUT.prof [N]` prints the top N functions by
cumulative and by own time.
"""
from __future__ import annotations

import cProfile
import importlib.util
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

from experiments.main_thread_sampler import MainThreadSampler


def _bench(anchor: str):
    spec = importlib.util.spec_from_file_location("anchor_models", anchor)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def one(anchor: str, backend: str, case: str, out: str) -> None:
    import torch
    bench = _bench(anchor)
    pool_runs = []
    if backend == "ember":
        import ember
        from ember.runtime import compile_pool, triton_driver
        if os.environ.get("PROBE_NO_DRIVER_AHEAD") == "1":
            triton_driver.load_ahead = lambda: None
        run = compile_pool.CompilePool.run

        def recorded(self, jobs, facts=None):      # the compile workers' jobs and errors, per kernel module
            errors = run(self, jobs, facts)
            pool_runs.append({"jobs": len(jobs), "errors": len(errors), "first_error": errors[0][-600:] if errors else None})
            return errors
        compile_pool.CompilePool.run = recorded
    name, mode = case.split(":")
    torch.manual_seed(0)
    model, inputs = bench.build(name, mode, "cuda")
    model = model.to("cuda")
    dt = torch.bfloat16
    if mode == "infer":
        model = model.to(dt).eval()
        inputs = tuple(x.to(dt) if x.is_floating_point() else x for x in inputs)
    else:
        model.train()
    compiled = torch.compile(model, backend=backend)

    def step():
        if mode == "infer":
            with torch.no_grad():
                return bench.first_tensor(compiled(*inputs))
        with torch.autocast("cuda", dtype=dt):
            loss = bench.first_tensor(compiled(*inputs)).float().pow(2).mean()
        loss.backward()
        return loss

    torch.cuda.synchronize()
    profile = cProfile.Profile() if os.environ.get("PROBE_PROFILE", "1") == "1" else None
    sampler = MainThreadSampler() if os.environ.get("PROBE_SAMPLE") == "1" else None
    modules_before = set(sys.modules)
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    if sampler is not None:
        sampler.__enter__()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    if sampler is not None:
        sampler.__exit__(None, None, None)
        sampler.write_folded(out + ".folded")
    if profile is not None:
        profile.disable()
        profile.dump_stats(out + ".prof")
    record = {"backend": backend, "case": case, "first_call_s": round(first, 3),
              "modules_imported": sorted(set(sys.modules) - modules_before),
              "dynamo": torch._dynamo.utils.compile_times(repr="str", aggregate=True)}
    try:
        names, seconds = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
        times = dict(zip(names, seconds))
        record.update(trace_s=times.get("bytecode_tracing"), backend_call_s=times.get("OutputGraph.call_user_compiler"))
    except (TypeError, ValueError):      # another torch's table
        pass
    if backend == "ember":
        m = ember.metrics
        record.update(compile_s=round(m.compile_seconds, 3), graph_cache_hits=m.graph_cache_hits,
                      graph_cache_misses=m.graph_cache_misses, whole_graph_hits=getattr(m, "whole_graph_hits", None),
                      binaries_loaded=getattr(m, "binaries_loaded", None), pool_runs=pool_runs, pool_started=bool(compile_pool._pool))
    if sampler is not None:
        record["main_thread"] = sampler.summary()
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k != "dynamo"}), flush=True)


def show(path: str, n: int = 40) -> None:
    stats = pstats.Stats(path)
    stats.sort_stats("cumulative").print_stats(n)
    stats.sort_stats("tottime").print_stats(n // 2)


def cold_then_warm(anchor: str, backend: str, case: str, out: str) -> None:
    root = tempfile.mkdtemp(prefix="first_call_")
    env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(root, "ember"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"), TRITON_CACHE_DIR=os.path.join(root, "triton"))
    phases = os.environ.get("PROBE_PHASES", "cold,warm,warm_profiled").split(",")
    for phase in phases:
        if phase.endswith("_jit"):      # the compile pool's markers emptied: the binaries load through Triton's JIT
            markers = os.path.join(root, "ember", "precompiled")
            for name in os.listdir(markers) if os.path.isdir(markers) else []:
                open(os.path.join(markers, name), "w").close()
        profiled = "1" if phase.endswith("_profiled") else "0"
        sampled = "1" if phase.endswith("_sampled") else "0"
        variant = {"EMBER_COMPILE_WORKERS": "0"} if "noworkers" in phase else {}
        if "nodriverahead" in phase:
            variant["PROBE_NO_DRIVER_AHEAD"] = "1"
        subprocess.run([sys.executable, "-m", "experiments.first_call_profile", anchor, backend, case,
                        f"{out}.{phase}"], env=dict(env, PROBE_PROFILE=profiled, PROBE_SAMPLE=sampled, **variant),
                       check=False)


if __name__ == "__main__":
    if sys.argv[1] == "--show":
        show(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 40)
    elif "--cold-then-warm" in sys.argv:
        cold_then_warm(*[a for a in sys.argv[1:] if a != "--cold-then-warm"])
    else:
        one(*sys.argv[1:5])
