"""A compiled AdamW step (foreach) over the parameters of a Llama-style model's shards: eager, inductor and
ember side by side; first call (s), steady step (ms), and ember's kernels and ATen fallbacks.

    python -m experiments.optimizer_step_probe [--device cpu|cuda] [--capturable] [--layers 8] [--dim 128]
        [--backends eager,inductor,ember]

Each layer holds nine parameters (attention's four projections, the MLP's three, two norms); the embedding,
the LM head and the final norm come on top: 75 parameters at the defaults.
"""
import argparse
import time

import torch


def _parameters(layers: int, dim: int, device: str) -> list:
    hidden, vocab = dim * 11 // 4, dim * 31
    per_layer = [(2 * dim, dim), (dim // 2, dim), (dim // 2, dim), (dim, dim), (hidden, dim), (hidden, dim),
                 (dim, hidden), (dim,), (dim,)]
    shapes = per_layer * layers + [(vocab, dim), (vocab, dim), (dim,)]
    return [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]


def _step(backend: str, params: list, capturable: bool):
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True, capturable=capturable)
    if backend == "eager":
        return opt.step
    torch._dynamo.reset()
    return torch.compile(opt.step, backend=backend)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    import ember
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--capturable", action="store_true", help="what Dynamo picks for CUDA parameters")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backends", default="eager,inductor,ember")
    a = ap.parse_args()
    for backend in a.backends.split(","):
        torch.manual_seed(0)
        params = _parameters(a.layers, a.dim, a.device)
        for p in params:
            p.grad = torch.randn_like(p)
        step = _step(backend, params, a.capturable and backend != "eager")
        ember.metrics.reset()
        _sync(a.device)
        t = time.perf_counter()
        step()
        _sync(a.device)
        first = time.perf_counter() - t
        step()
        _sync(a.device)
        t = time.perf_counter()
        for _ in range(a.steps):
            step()
        _sync(a.device)
        steady = (time.perf_counter() - t) / a.steps * 1e3
        extra = (f", kernels {ember.metrics.generated_kernel_count}, ATen fallbacks "
                 f"{sum(ember.metrics.fallbacks.values())}") if backend == "ember" else ""
        print(f"{backend:9s} {len(params)} parameters: first call {first:.1f} s, step {steady:.2f} ms{extra}",
              flush=True)


if __name__ == "__main__":
    main()
