"""On a GPU: bf16 inference of anchor models (anchor_models.py's configs) with the bias and activation of
products in cuBLASLt's epilogue (graph/passes/library_epilogues.py, ember's default) and without (the bias
and activation in ember's kernel after the product), and under inductor, all compiled in one process and
timed in turn: median step ms (CUDA events, rounds of 10 steps), kernel launches per step, and the largest
difference from the eager model's output.

    python -m experiments.library_epilogue_probe [--models gpt2] [--rounds 5]

ANCHOR_MODELS: the path of anchor_models.py (default ../shared/bench/anchor_models.py).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import ember
from ember.device import backend_for
from experiments.gather_probe import anchor, launches, timed_in_turn

VARIANTS = ("library", "kernel", "inductor")


def _step_fn(am, model, inputs, variant: str):
    def step():
        with torch.no_grad():
            return am.first_tensor(model(*inputs))
    step.__code__ = step.__code__.replace(co_name=f"step_{variant}")      # Dynamo compiles each apart
    return torch.compile(step, backend="inductor" if variant == "inductor" else "ember")


def _first_call(fn, variant: str):
    backend = backend_for("cuda")
    kept = backend.library_bias_activations
    if variant == "kernel":
        backend.library_bias_activations = frozenset()
    try:
        with ember.config.patch(graph_cache=False):     # a cached graph would be the other variant's
            out = fn()
        torch.cuda.synchronize()
    finally:
        backend.library_bias_activations = kept
    return out


def run(am, name: str, rounds: int) -> dict:
    torch.manual_seed(0)
    model, inputs = am.build(name, "infer", "cuda")
    model = model.cuda().to(torch.bfloat16).eval()
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():
        ref = am.first_tensor(model(*inputs)).float()
    fns = {v: _step_fn(am, model, inputs, v) for v in VARIANTS}
    result = {}
    for v, fn in fns.items():
        out = _first_call(fn, v).float()
        result[v] = {"max |diff| vs eager": (out - ref).abs().max().item(), "launches": launches(fn)}
        del out
    for v, ms in timed_in_turn(fns, rounds).items():
        result[v]["ms"] = statistics.median(ms)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    am = anchor()
    for name in a.models.split(","):
        print(name, json.dumps(run(am, name, a.rounds), indent=1), flush=True)


if __name__ == "__main__":
    main()
