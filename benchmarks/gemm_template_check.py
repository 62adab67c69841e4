"""GEMM templates on a GPU: ember with ember.config.gemm_templates "never" (cuBLAS through ATen, epilogues in a
separate kernel) against "auto" (the template with its fused epilogue, timed against that at first call)
and "always" (the template whatever the timing says), on the cases of the shared anchor benchmark.

    python -m benchmarks.gemm_template_check [--anchor ../shared/bench/anchor_gemm.py] [--cases a,b]
                                             [--modes never,auto,always]

Per case and mode: TFLOP/s (median of the anchor's timing), the first call's seconds (compile, tuning), the
template kernels generated and the pointwise nodes fused into them, and the relative error against a
float32 product (the anchor's check: below 2e-2). Each case is compiled fresh, with an empty autotuning
cache, so "auto" times its candidates.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import torch

import ember


def _anchor(path: str):
    spec = importlib.util.spec_from_file_location("anchor_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_case(anchor, name: str, mode: str) -> dict:
    torch.manual_seed(0)
    fn, args = anchor.make(name, "cuda")
    ref = fn(*[t.float() for t in args]).float()
    torch._dynamo.reset()
    ember.metrics.reset()
    with ember.config.patch(gemm_templates=mode, graph_cache=False):
        compiled = torch.compile(fn, backend="ember")
        t0 = time.time()
        out = compiled(*args)
        torch.cuda.synchronize()
        first = time.time() - t0
        ms = anchor.bench(compiled, args)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return {"TFLOPs": anchor.flops(name) / ms / 1e9, "first_s": first, "rel_err": err,
            "templates": ember.metrics.template_kernels, "fused": ember.metrics.fused_epilogue_nodes}


def main(argv=None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor", default=os.path.join(here, "..", "shared", "bench", "anchor_gemm.py"))
    ap.add_argument("--cases", default=None)
    ap.add_argument("--modes", default="never,auto,always")
    a = ap.parse_args(argv)
    anchor = _anchor(a.anchor)
    modes = a.modes.split(",")
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember_gemm_check_")   # fresh tuning choices
    print(f"{'case':26}{'eager':>9}" + "".join(f"{m:>34}" for m in modes))
    print(f"{'':26}{'TFLOP/s':>9}" + "".join(f"{'TFLOP/s  first-s  tmpl/fused  err':>34}" for _ in modes))
    for name in (a.cases.split(",") if a.cases else list(anchor.CASES)):
        torch.manual_seed(0)
        fn, args = anchor.make(name, "cuda")
        eager = anchor.flops(name) / anchor.bench(fn, args) / 1e9
        cells = []
        for mode in modes:
            try:
                r = run_case(anchor, name, mode)
                bad = "" if r["rel_err"] < 2e-2 else " WRONG"
                cells.append(f"{r['TFLOPs']:8.0f} {r['first_s']:8.1f} {r['templates']:5d}/{r['fused']:<5d}"
                             f"{r['rel_err']:.0e}{bad}")
            except Exception as e:       # a case that fails is reported, the others still run
                cells.append(f"{'ERR ' + type(e).__name__:>33}")
        print(f"{name:26}{eager:9.0f}" + "".join(f"{c:>34}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
