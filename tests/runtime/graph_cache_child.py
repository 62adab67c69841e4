"""One process of tests/runtime/test_graph_cache_processes.py: compiles a small GPT block's forward and
backward with ember, with the environment's cache directory, and writes what the test compares.

    python graph_cache_child.py OUT_PREFIX SEED

OUT_PREFIX.json: ember's counters, the wrappers' sources, the modules of inductor the first step imported,
the largest difference from eager on fresh inputs drawn from SEED; OUT_PREFIX.pt: outputs and gradients on inputs every process draws alike."""
import json
import sys

import torch

import ember
from ember.demo import Block          # the demo's GPT block: attention (causal mask, softmax) and a GELU MLP
pipeline = sys.modules["ember.compile_graph"]     # the module (ember.compile_graph is the function)


def step(model, x):
    """Outputs, then the gradients of the input and of every parameter, of one forward and backward."""
    model.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    out = model(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


def main(prefix: str, seed: int) -> None:
    sources = []
    assemble = pipeline._assemble      # every compiled graph, whether compiled or loaded from a cache

    def recording(*args, **kwargs):
        compiled = assemble(*args, **kwargs)
        sources.append(compiled.source)
        return compiled

    pipeline._assemble = recording
    torch.manual_seed(0)
    model = Block(d=32, n_head=2, seq=8)
    compiled = torch.compile(model, backend="ember")
    same = torch.randn(2, 8, 32)                  # every process's inputs
    before = set(sys.modules)
    results = step(compiled, same)
    imported = sorted(name for name in set(sys.modules) - before if name.startswith("torch._inductor"))
    torch.manual_seed(seed)
    fresh = torch.randn(2, 8, 32)                 # this process's own
    diff = max((a - e).abs().max().item() for a, e in zip(step(compiled, fresh), step(model, fresh)))
    diff_same = max((a - e).abs().max().item() for a, e in zip(results, step(model, same)))
    torch.save(results, prefix + ".pt")
    with open(prefix + ".json", "w") as f:
        json.dump({"hits": ember.metrics.graph_cache_hits, "misses": ember.metrics.graph_cache_misses,
                   "compile_seconds": ember.metrics.compile_seconds, "graphs": ember.metrics.graphs_compiled,
                   "eager_fallbacks": ember.metrics.eager_fallbacks, "sources": sources,
                   "whole_graph_hits": ember.metrics.whole_graph_hits, "inductor_modules_imported": imported,
                   "max_diff_from_eager": max(diff, diff_same)}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
