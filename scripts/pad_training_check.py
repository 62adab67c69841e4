"""Padded matmuls (post_grad.pad_matmuls) on training graphs: is GPT-2's training step as accurate? One training
step of the models benchmark's GPT-2 (bf16 autocast), ember with the pass forced onto the forward graph,
the backward graph, both or neither, and with autotuning off; the worst gradients by RMSE against float64,
as a multiple of eager's. Needs a CUDA GPU:
    python scripts/pad_training_check.py [--model gpt2]

Session 10 found with it that padding the forward graph alone broke the gradients (ln_f x18): the logits,
a view of the padded product, were returned with the padded row stride to a backward graph compiled for
eager's; the lowering now copies such an output into eager's strides (lowering/graph_lowering.py, _realize_output)."""
import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ember  # noqa: E402
from benchmarks.models import build, make_inputs, run_step  # noqa: E402
from ember.graph.passes import post_grad  # noqa: E402


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    a = ap.parse_args()
    torch.manual_seed(0)
    model, n_out = build(a.model, small=False)
    model = model.cuda()
    inp = make_inputs(a.model, "train", False, n_out, "cuda")
    m64 = copy.deepcopy(model).double()
    run_step(m64, inp, "train", "cuda", amp=False)
    ref64 = grads(m64)
    del m64
    run_step(model, inp, "train", "cuda")
    eager = grads(model)
    plain_run = post_grad.run
    for where, autotune in (("none", True), ("both", True), ("forward", True), ("backward", True),
                            ("both", False)):
        def run(gm, where=where):
            backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes)
            pad = where == "both" or where == ("backward" if backward else "forward")
            passes = post_grad.PASSES
            post_grad.PASSES = [p for p in passes if pad or p is not post_grad.pad_matmuls]
            try:
                return plain_run(gm)
            finally:
                post_grad.PASSES = passes
        post_grad.run = run
        torch._dynamo.reset()
        with ember.config.patch(autotune=autotune):
            cm = torch.compile(model, backend="ember")
            run_step(cm, inp, "train", "cuda")
            run_step(cm, inp, "train", "cuda")
        got = grads(model)
        ratios = sorted(((rmse(got[n], ref64[n]) / max(rmse(eager[n], ref64[n]), 1e-30), n) for n in ref64),
                        reverse=True)
        print(f"pad={where:8} autotune={autotune!s:5} worst: " +
              ", ".join(f"{n} x{r:.2f}" for r, n in ratios[:4]), flush=True)
    post_grad.run = plain_run


if __name__ == "__main__":
    main()
