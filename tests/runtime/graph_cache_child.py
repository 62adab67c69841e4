"""One process of tests/runtime/test_graph_cache_processes.py: compiles a small GPT block's forward and
backward with ember, with the environment's cache directory, and writes what the test compares.

    python graph_cache_child.py OUT_PREFIX SEED

OUT_PREFIX.json: ember's counters, the wrappers' sources, the largest difference from eager on fresh
inputs drawn from SEED; OUT_PREFIX.pt: outputs and gradients on inputs every process draws alike."""
import json
import sys

import torch

import ember
pipeline = sys.modules["ember.compile_graph"]     # the module (ember.compile_graph is the function)


class Block(torch.nn.Module):
    """Pre-norm attention and MLP, GPT-style."""

    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc, self.out = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def step(model, x):
    """Outputs, then the gradients of the input and of every parameter, of one forward and backward."""
    model.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    out = model(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


def main(prefix: str, seed: int) -> None:
    sources = []
    compile_one = pipeline._compile

    def recording(*args):
        compiled = compile_one(*args)
        sources.append(compiled.source)
        return compiled

    pipeline._compile = recording
    torch.manual_seed(0)
    model = Block()
    compiled = torch.compile(model, backend="ember")
    same = torch.randn(2, 8, 32)                  # every process's inputs
    results = step(compiled, same)
    torch.manual_seed(seed)
    fresh = torch.randn(2, 8, 32)                 # this process's own
    diff = max((a - e).abs().max().item() for a, e in zip(step(compiled, fresh), step(model, fresh)))
    diff_same = max((a - e).abs().max().item() for a, e in zip(results, step(model, same)))
    torch.save(results, prefix + ".pt")
    with open(prefix + ".json", "w") as f:
        json.dump({"hits": ember.metrics.graph_cache_hits, "misses": ember.metrics.graph_cache_misses,
                   "compile_seconds": ember.metrics.compile_seconds, "graphs": ember.metrics.graphs_compiled,
                   "eager_fallbacks": ember.metrics.eager_fallbacks, "sources": sources,
                   "max_diff_from_eager": max(diff, diff_same)}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
