"""One step of a benchmark model (benchmarks/models.py) with ember, set up to find what goes wrong. Run from the
repository root:

    CUDA_LAUNCH_BLOCKING=1 python -m scripts.debug_model_step convnext --mode train
    python -m scripts.debug_model_step bert --small --variants            # which setting changes the gradients?
    python -m scripts.debug_model_step mlp --small --device cpu           # a CPU smoke run

Default: ember raises instead of falling back to eager, and the autotuner logs each candidate config before
launching it; with CUDA_LAUNCH_BLOCKING=1 (and EMBER_DEBUG_SYNC=1) a CUDA fault surfaces at the launch that
caused it, so the traceback's last wrapper line names the faulting kernel. The outputs and gradients are
compared with eager's. Add EMBER_DEBUG=1 EMBER_DEBUG_DIR=dir to keep every graph's kernels and wrapper.

--variants [NAMES]: a training step under each setting in VARIANTS (default: all), each compared with a
float64 reference as a multiple of eager bf16-autocast's own error: a setting whose row stands out (a
worst ratio far above 1, "bad" tensors) is where a wrong gradient comes from.
"""
from __future__ import annotations

import argparse
import copy
import logging
import sys
import traceback

import torch

import ember
import ember.codegen.program as program
from benchmarks import models as M

# name -> ember.config changes; "in_place_off" also stops kernels from writing over their dying inputs
VARIANTS = {"default": {}, "fuse_off": dict(fuse=False), "hfuse_off": dict(horizontal_fusion=False),
            "autotune_off": dict(autotune=False), "in_place_off": {},
            "persist_max_1": dict(persistent_reduction_max=1)}


def gradients(model, inp: dict, device: str, amp: bool) -> dict:
    M.run_step(model, inp, "train", device, amp=amp)
    return {n.replace("_orig_mod.", ""): p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def compare_variants(a, names: list[str]) -> int:
    torch.manual_seed(0)
    base, n_out = M.build(a.model, a.small)
    inp = M.make_inputs(a.model, "train", a.small, n_out, a.device)
    inp64 = {k: v.double() if v.is_floating_point() else v for k, v in inp.items()}
    g64 = gradients(copy.deepcopy(base).double().to(a.device), inp64, a.device, amp=False)
    g_eager = gradients(copy.deepcopy(base).to(a.device), inp, a.device, amp=True)
    can_overwrite = program.can_overwrite
    worst_of_all = 0.0
    for name in names:
        torch._dynamo.reset()
        if name == "in_place_off":
            program.can_overwrite = lambda *args: False
        try:
            with ember.config.patch(**VARIANTS[name]):
                g = gradients(torch.compile(copy.deepcopy(base).to(a.device), backend="ember"), inp, a.device, amp=True)
        finally:
            program.can_overwrite = can_overwrite
        ratio = {k: M.rmse(g[k], g64[k]) / max(M.rmse(g_eager[k], g64[k]), 1e-12) for k in g64}
        worst = max(ratio, key=ratio.get)
        bad = sum(M.rmse(g[k], g64[k]) > 3 * M.rmse(g_eager[k], g64[k]) + 1e-9 for k in g64)
        worst_of_all = max(worst_of_all, ratio[worst])
        print(f"{a.model:8} {name:14} worst x{ratio[worst]:9.2f} ({worst})  bad {bad}/{len(g64)}", flush=True)
    return 0 if worst_of_all <= 3 else 1


def one_step(a) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("ember").setLevel(logging.DEBUG)
    torch.manual_seed(0)
    model, n_out = M.build(a.model, a.small)
    model = model.to(a.device).train(a.mode == "train")
    inp = M.make_inputs(a.model, a.mode, a.small, n_out, a.device)
    if a.batch:
        inp = {k: v[:a.batch] for k, v in inp.items()}
    ref = M.run_step(model, inp, a.mode, a.device)
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    compiled = torch.compile(model, backend="ember")
    try:
        with ember.config.patch(fallback_on_error=False):
            for _ in range(a.steps):
                out = M.run_step(compiled, inp, a.mode, a.device)
                M.sync(a.device)
    except Exception:
        traceback.print_exc()
        print("FAILED: the traceback's last wrapper line is the failing kernel (or extern call)")
        return 1
    params = dict(model.named_parameters())
    off = [k for k, g in ref_grads.items()
           if not torch.allclose(params[k].grad, g, rtol=5e-2, atol=5e-2 * max(g.abs().max().item(), 1e-6))]
    print(f"ran {a.steps} steps; max |out - eager| {(out.float() - ref.float()).abs().max().item():.3g}; "
          f"{len(off)} of {len(ref_grads)} gradients off by > 5%: {off[:5]}")
    return 1 if off else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=M.MODELS + ["mlp"])
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--small", action="store_true", help="the tiny config of the CPU smoke runs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=None, help="fewer samples than the benchmark's")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--variants", nargs="?", const=",".join(VARIANTS), default=None,
                   help=f"compare training gradients under these settings (default: all of {', '.join(VARIANTS)})")
    a = p.parse_args(argv)
    if a.variants is None:
        return one_step(a)
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    return compare_variants(a, names)


if __name__ == "__main__":
    sys.exit(main())
