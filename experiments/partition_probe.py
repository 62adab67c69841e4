"""On a GPU: anchor models' training steps (anchor_models.py's configs, bf16 autocast) under ember with each
policy for what the backward recomputes (graph/passes/partition.py), and under inductor, all compiled in
one process and timed in turn: median step (CUDA events), peak memory of a step (forward and backward
apart), bytes the forward leaves for the backward, kernel launches per step.

    python -m experiments.partition_probe [--models llama_small,gpt2] [--lm-loss ce] [--rounds 5]
        [--variants torch,operands,operands+casts,inductor]

Variants: "torch" is torch's partition policy (no value the backward's products read is recomputed);
"operands" recomputes them, weight casts saved (ember's default); "operands+casts" recomputes the weights'
casts too; "inductor" is torch.compile's default backend. `--lm-loss ce` is the models' own shifted
cross-entropy (labels = the inputs), as `anchor_models.py --lm-loss ce`. ANCHOR_MODELS: the path of
anchor_models.py (default ../shared/bench/anchor_models.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import ember
from experiments.gather_probe import anchor, launches, timed_in_turn

SETTINGS = {"torch": {"recompute_product_operands": False},
            "operands": {"recompute_product_operands": True, "save_weight_casts": True},
            "operands+casts": {"recompute_product_operands": True, "save_weight_casts": False}}


def _step_fn(am, model, inputs, variant: str, lm_loss: str):
    """(a training step, its first call under the variant's settings, the step's forward peak in bytes)."""
    def model_fn():     # the model's forward alone is compiled, as anchor_models.py compiles the model
        if lm_loss == "ce":
            return model(*inputs, labels=inputs[0])
        return model(*inputs)
    # a code object of its own per variant: Dynamo compiles each separately
    model_fn.__code__ = model_fn.__code__.replace(co_name=f"model_{variant.replace('+', '_')}")
    compiled = torch.compile(model_fn, backend="inductor" if variant == "inductor" else "ember")
    peak = {"fwd": 0}

    def step():
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled()
            loss = out.loss if lm_loss == "ce" else am.first_tensor(out).float().pow(2).mean()
            del out
        peak["fwd"] = max(peak["fwd"], torch.cuda.max_memory_allocated())
        peak["held"] = torch.cuda.memory_allocated() - before     # what the forward leaves for the backward
        torch.cuda.reset_peak_memory_stats()
        loss.backward()

    def first():
        with ember.config.patch(**SETTINGS.get(variant, {})):
            step()
    return step, first, peak


def run(am, name: str, variants: list, rounds: int, lm_loss: str) -> dict:
    torch.manual_seed(0)
    model, inputs = am.build(name, "train", "cuda")
    model = model.cuda().train()
    fns = {v: _step_fn(am, model, inputs, v, lm_loss) for v in variants}
    result = {}
    for v, (fn, first, saved) in fns.items():
        t0 = time.perf_counter()
        first()
        torch.cuda.synchronize()
        result[v] = {"first call s": time.perf_counter() - t0}
    for v, (fn, first, saved) in fns.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        saved["fwd"] = 0
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        result[v]["peak GiB fwd"] = saved["fwd"] / 2**30
        result[v]["peak GiB bwd"] = torch.cuda.max_memory_allocated() / 2**30
        result[v]["saved GiB"] = saved["held"] / 2**30
        result[v]["launches"] = launches(fn)
    for v, ms in timed_in_turn({v: fn for v, (fn, _, _) in fns.items()}, rounds).items():
        result[v]["ms"] = ms
    for v in variants:
        result[v]["ms spread"] = [round(min(result[v]["ms"]), 2), round(max(result[v]["ms"]), 2)]
        result[v]["ms"] = statistics.median(result[v]["ms"])
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama_small,gpt2")
    p.add_argument("--variants", default="torch,operands,operands+casts,inductor")
    p.add_argument("--lm-loss", default="pow2", choices=["pow2", "ce"])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    am = anchor()
    ember.config.graph_cache = False        # each variant compiles the same graphs again
    torch._dynamo.config.cache_size_limit = 64
    for name in a.models.split(","):
        r = run(am, name, a.variants.split(","), a.rounds, a.lm_loss)
        print(json.dumps({"model": name, "lm_loss": a.lm_loss, **r}), flush=True)
        for v, row in r.items():
            print(f"{name:12s} {a.lm_loss:4s} {v:15s} step {row['ms']:7.2f} ms {row['ms spread']}  peak fwd "
                  f"{row['peak GiB fwd']:.2f} bwd {row['peak GiB bwd']:.2f} GiB  saved {row['saved GiB']:.2f} GiB  "
                  f"launches {row['launches']:5d}  first call {row['first call s']:.1f} s", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
