"""One training (or inference) step of a benchmark model with ember, set up to find a failing kernel:
ember raises instead of falling back to eager, kernel launches are synchronous (a CUDA fault surfaces at
the launch that caused it), and the autotuner logs each candidate config before launching it (a faulting
candidate is the last one named). Gradients are compared with eager's.

    CUDA_LAUNCH_BLOCKING=1 python scripts/debug_model_step.py convnext --mode train
    python scripts/debug_model_step.py convnext --small --device cpu       # a CPU smoke run
Add EMBER_DEBUG=1 EMBER_DEBUG_DIR=dir to keep every graph's kernels and wrapper.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import models  # noqa: E402  (benchmarks/models.py: the same models, inputs and step)

import ember  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=models.MODELS)
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--small", action="store_true", help="the tiny config of the CPU smoke runs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=None, help="fewer samples than the benchmark's")
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()

    ember.config.fallback_on_error = False
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("ember").setLevel(logging.DEBUG)
    torch.manual_seed(0)
    model, n_out = models.build(a.model, a.small)
    model = model.to(a.device).train(a.mode == "train")
    inp = models.make_inputs(a.model, a.mode, a.small, n_out, a.device)
    if a.batch:
        inp = {k: v[:a.batch] for k, v in inp.items()}
    ref = models.run_step(model, inp, a.mode, a.device)
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    compiled = torch.compile(model, backend="ember")
    try:
        for _ in range(a.steps):
            out = models.run_step(compiled, inp, a.mode, a.device)
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
    except Exception:
        traceback.print_exc()
        print("FAILED: the traceback's last wrapper line is the failing kernel (or extern call)")
        return 1
    off = [k for k, g in ref_grads.items()
           if not torch.allclose(dict(model.named_parameters())[k].grad, g, rtol=5e-2,
                                 atol=5e-2 * max(g.abs().max().item(), 1e-6))]
    print(f"ran {a.steps} steps; max |out - eager| {(out.float() - ref.float()).abs().max().item():.3g}; "
          f"{len(off)} of {len(ref_grads)} gradients off by > 5%: {off[:5]}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
