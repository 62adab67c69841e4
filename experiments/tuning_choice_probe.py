"""On a GPU: which autotuning candidate wins for each tuned kernel of an anchor model's step, and what each
candidate's time is, so that candidate lists can be cut where they buy nothing but compiles.

    python -m experiments.tuning_choice_probe ANCHOR_MODELS OUT.json [--cases bert_base:train,gpt2:infer]
    python -m experiments.tuning_choice_probe --analyze OUT.json [OUT2.json ...]

Each case runs in a fresh process with empty ember and Triton caches (a cold compile): the anchor's model
and inputs (`build` of ../shared/bench/anchor_models.py), bf16 inference or bf16-autocast training as the
anchor runs them, compiled with ember. Recorded per case: the first call's seconds, ember's compile seconds
per stage, the Triton compile jobs sent to the workers, and for every kernel the autotuner timed, its
candidates' times in candidate order (the heuristic's choice first), its launches per step and whether it is a
Welford reduction.
PROBE_NO_PREPARE=1 boots the compile workers at the first generated kernel instead of at AOTAutograd's trace.
`--analyze` prints, per candidate-list policy, the step's tuned-kernel time against the full list's and
the compile jobs it would need.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = [f"{m}:{mode}" for m in ("bert_base", "gpt2", "llama_small", "vit_b16", "convnext_tiny", "resnet50")
         for mode in ("train", "infer")]


def _one(anchor: str, case: str) -> dict:
    import torch
    import ember
    from ember.runtime import autotune, compile_pool

    name, mode = case.split(":")
    spec = importlib.util.spec_from_file_location("anchor_models", anchor)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    tuned, launches, counting, jobs = [], collections.Counter(), [False], [0]
    fastest, tune, run = autotune.fastest, autotune.Autotuned._tune, autotune.Autotuned.run
    kinds, init = {}, autotune.Autotuned.__init__

    def init_recorded(self, fn, tuning, source):
        init(self, fn, tuning, source)
        kinds[self.key] = "welford" if "welford_combine" in source else "other"
    autotune.Autotuned.__init__ = init_recorded
    current = [None]

    def tune_recorded(self, sizes, args, configs):
        current[0] = (self.key, sizes)
        return tune(self, sizes, args, configs)

    def fastest_recorded(candidates, time_fn, args, written, what):
        timings = []

        def timed(c):
            t = time_fn(c)
            timings.append((t, c))
            return t
        best = fastest(candidates, timed, args, written, what)
        key, sizes = current[0] if what == "ember autotune" else (what, None)
        tuned.append({"key": key, "sizes": sizes, "what": what, "candidates": candidates,
                      "timings": timings, "best": best})
        return best

    def run_counted(self, *args):
        if counting[0]:
            launches[self.key] += 1
        return run(self, *args)

    pool_run = compile_pool.CompilePool.run

    def pool_run_counted(self, jobs_, facts=None):
        jobs[0] += len(jobs_)
        return pool_run(self, jobs_, facts)
    autotune.fastest, autotune.Autotuned._tune, autotune.Autotuned.run = fastest_recorded, tune_recorded, run_counted
    compile_pool.CompilePool.run = pool_run_counted

    if os.environ.get("PROBE_NO_PREPARE"):        # workers boot at the first kernel, as before prepare()
        from ember.codegen.triton.backend import TritonBackend
        TritonBackend.prepare = lambda self: None
    torch.manual_seed(0)
    model, inputs = bench.build(name, mode, "cuda")
    model = model.cuda()
    if mode == "infer":
        model = model.to(torch.bfloat16).eval()
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    compiled = torch.compile(model, backend="ember")

    def step():
        if mode == "infer":
            with torch.no_grad():
                return bench.first_tensor(compiled(*inputs))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = bench.first_tensor(compiled(*inputs)).float().pow(2).mean()
        loss.backward()
        return loss

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    counting[0] = True
    step()
    counting[0] = False
    times = [autotune.time_once(step) for _ in range(10)]
    for t in tuned:
        t["launches"] = launches.get(t["key"], 0)
        t["kind"] = kinds.get(t["key"], "?")
    return {"case": case, "first_call_s": first, "step_ms": sorted(times)[len(times) // 2],
            "compile_s": ember.metrics.compile_seconds,
            "stages": dict(ember.metrics.compile_stage_seconds), "kernels": ember.metrics.generated_kernel_count,
            "compile_jobs": jobs[0],
            "tuned": tuned}


def _analyze(paths: list[str]) -> None:
    """Per policy (which candidates of each list are kept), the tuned kernels' ms per step against the
    full list's, over every case."""
    cases = [c for p in paths for c in json.load(open(p))]

    def shape(c):
        return tuple(c.get(k) for k in ("XBLOCK", "RBLOCK", "num_warps", "RSTAGES"))
    policies = {f"first {k}": (lambda k: lambda cands: cands[:k])(k) for k in (1, 2, 3, 4, 5, 6, 8)}
    print(f"{'case':22} {'first s':>8} {'compile s':>9} {'kern compile':>12} {'jobs':>5} {'tuned':>6} {'step ms':>8}")
    for c in cases:
        print(f"{c['case']:22} {c['first_call_s']:8.1f} {c['compile_s']:9.1f} "
              f"{c['stages'].get('kernel compile/load', 0):12.1f} {c['compile_jobs']:5d} {len(c['tuned']):6d} "
              f"{c['step_ms']:8.2f}")
    print()
    wins = collections.Counter()
    for c in cases:
        for t in c["tuned"]:
            if t["what"] != "ember autotune" or not t["timings"]:
                continue
            order = [shape(x) for x in t["candidates"]]
            wins[(len(order), order.index(shape(t["best"])))] += 1
    print("winner's position in its list (list length, position) -> kernels:", dict(sorted(wins.items())))
    print()
    print(f"{'policy':10} " + " ".join(f"{c['case'][:14]:>15}" for c in cases) + "   (tuned-kernel ms per step, "
          "full list / policy)")
    for pname, keep in policies.items():
        cells = []
        for c in cases:
            full = kept = 0.0
            for t in c["tuned"]:
                if t["what"] != "ember autotune" or not t["timings"]:
                    continue
                times = {json.dumps(x, sort_keys=True): ms for ms, x in t["timings"]}
                n = max(1, t["launches"])
                full += n * min(times.values())
                sub = [times[k] for k in (json.dumps(x, sort_keys=True) for x in keep(t["candidates"])) if k in times]
                kept += n * (min(sub) if sub else max(times.values()))
            cells.append(f"{full:7.2f}/{kept:7.2f}")
        print(f"{pname:10} " + " ".join(f"{x:>15}" for x in cells))
    print()
    print("largest losses of 'first 3' (case, key, launches, full ms, first-3 ms, candidates by time):")
    losses = []
    for c in cases:
        for t in c["tuned"]:
            if t["what"] != "ember autotune" or not t["timings"]:
                continue
            times = {json.dumps(x, sort_keys=True): ms for ms, x in t["timings"]}
            sub = [times[k] for k in (json.dumps(x, sort_keys=True) for x in t["candidates"][:3]) if k in times]
            n = max(1, t["launches"])
            losses.append((n * (min(sub) - min(times.values())), c["case"], t["key"][:8], n, min(times.values()),
                           min(sub), sorted((round(ms * 1e3, 1), shape(x)) for ms, x in t["timings"])))
    for row in sorted(losses, reverse=True)[:15]:
        print(" ", row)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--analyze", nargs="+")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    if a.analyze:
        _analyze(a.analyze)
        return
    if a.one:
        print("RESULT " + json.dumps(_one(a.anchor, a.one)), flush=True)
        return
    results = []
    for case in a.cases.split(","):
        env = dict(os.environ, EMBER_CACHE_DIR=tempfile.mkdtemp(prefix="ember"),
                   TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton"))
        try:
            p = subprocess.run([sys.executable, "-m", "experiments.tuning_choice_probe", a.anchor, "-", "--one", case],
                               capture_output=True, text=True, env=env, timeout=a.timeout)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            results.append(json.loads(line[-1][7:]) if line else {"case": case, "error": p.stderr[-2000:]})
        except subprocess.TimeoutExpired:
            results.append({"case": case, "error": "timeout"})
        r = results[-1]
        print(case, r.get("error") or f"first {r['first_call_s']:.1f} s, {len(r['tuned'])} tuned, "
              f"step {r['step_ms']:.2f} ms", flush=True)
        json.dump([x for x in results if "error" not in x], open(a.out, "w"))
        with open(a.out + ".errors", "w") as f:
            json.dump([x for x in results if "error" in x], f)


if __name__ == "__main__":
    main()
