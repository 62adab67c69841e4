"""Gradients of a causal LM's training step with its own loss (labels given) against an fp32 eager step: eager
under bf16 autocast, ember with the linear cross-entropy rewrite off and on. Prints, per run, the loss and
the worst parameters' relative error (norm of the difference over the reference's norm). Hugging Face GPT-2
gets `loss_type = "ForCausalLM"`, which keeps its loss in the graph (without it, a `logger.warning_once`
breaks the graph there). Dropout is off, so that the runs draw nothing; 2 x 512 tokens of the anchor's input.

    python -m experiments.lm_head_accuracy_probe ../shared/bench/anchor_models.py gpt2,llama_small
"""
from __future__ import annotations

import copy
import importlib.util
import sys

import torch

import ember


def _bench(anchor: str):
    spec = importlib.util.spec_from_file_location("anchor_models", anchor)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def step(model, ids, backend: str, amp: bool, rewrite: bool = True):
    m = copy.deepcopy(model)
    torch._dynamo.reset()
    with ember.config.patch(fused_linear_cross_entropy=rewrite):
        fn = m if backend == "eager" else torch.compile(m, backend="ember")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = fn(ids, labels=ids)
        out.loss.backward()
    return out.loss.item(), {k: p.grad.float() for k, p in m.named_parameters() if p.grad is not None}


def main(anchor: str, models: str) -> None:
    bench = _bench(anchor)
    for name in models.split(","):
        torch.manual_seed(0)
        model, inputs = bench.build(name, "train", "cuda")
        model = model.cuda().train()
        if name == "gpt2":
            model.loss_type = "ForCausalLM"
        for mod in model.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        ids = inputs[0][:2, :512].contiguous()
        ref_loss, ref = step(model, ids, "eager", False)
        for label, args in (("eager bf16", ("eager", True)), ("ember off", ("ember", True, False)),
                            ("ember on", ("ember", True, True))):
            loss, grads = step(model, ids, *args)
            errs = sorted((((grads[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-12)).item(), k) for k in ref)[::-1]
            print(f"{name} {label:11} loss {loss:.5f} (fp32 {ref_loss:.5f}) worst {errs[0][0]:.2e} {errs[0][1]}; "
                  f"next {errs[1][0]:.2e} {errs[1][1]}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
