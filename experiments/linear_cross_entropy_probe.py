"""Peak memory and time of one training step of a GPT-2-sized LM head, `cross_entropy(linear(x, W), t)`:
eager, ember without the linear cross-entropy rewrite, ember with it (chunked, ember::linear_cross_entropy),
and ember with it while the program also returns the logits. Runs on the CPU by default (peak bytes from
the profiler's allocation records) or on a GPU (`--device cuda`: CUDA's allocator statistics).

    python -m experiments.linear_cross_entropy_probe [--tokens 2048 --hidden 768 --vocab 50257 --dtype float32]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import ember
from ember.testing import peak_bytes


def loss_only(x, w, t):
    return F.cross_entropy(F.linear(x, w), t, ignore_index=-100)


def loss_and_logits(x, w, t):
    logits = F.linear(x, w)
    return F.cross_entropy(logits.float(), t, ignore_index=-100), logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    dtype, dev = getattr(torch, a.dtype), a.device
    torch.manual_seed(0)
    x = torch.randn(a.tokens, a.hidden, device=dev, dtype=dtype, requires_grad=True)
    w = (torch.randn(a.vocab, a.hidden, device=dev) * 0.02).to(dtype).requires_grad_(True)
    t = torch.randint(0, a.vocab, (a.tokens,), device=dev)
    t[::7] = -100

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    cases = [("eager", loss_only, None), ("ember, no rewrite", loss_only, False), ("ember", loss_only, True),
             ("ember, logits returned", loss_and_logits, True)]
    for name, fn, rewrite in cases:
        torch._dynamo.reset()
        run = fn
        if rewrite is not None:
            with ember.config.patch(fused_linear_cross_entropy=rewrite):
                run = torch.compile(fn, backend="ember")
                run(x, w, t)            # compile here, under the setting

        def step():
            out = run(x, w, t)
            (out[0] if isinstance(out, tuple) else out).backward()
            x.grad = w.grad = None

        step()
        peak = peak_bytes(step)
        sync()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            step()
        sync()
        ms = (time.perf_counter() - t0) / a.iters * 1e3
        print(f"{name:24s} peak {peak / 2**20:8.1f} MiB   step {ms:8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
