"""ember's short-query attention kernels (codegen/triton/short_attention.py) on a GPU, per tiling: key block
(BLOCK_N), keys per split (chunk), warps and stages, against eager's SDPA (the library kernel torch picks),
for decoding shapes (one query per head, 16 query heads over 4 key/value heads, head dim 64, bf16, an
additive mask over the keys), each timed inside a CUDA graph of 50 back-to-back calls; us per call.
Usage: python -m experiments.short_attention_probe [--keys 208,1024,4096] [--batch 1]"""
import argparse
import itertools
import math

import torch
import torch.nn.functional as F

from ember.codegen.triton.short_attention import launches, plan
from ember.codegen.triton.spelling import module_header
from ember.ir.kernel_call import ShortQueryAttentionSpec
from ember.runtime.loader import load_module
from experiments.skinny_gemm_probe import graph_us


def _strides(t):
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def probe(B, N, Hq=16, Hkv=4, D=64):
    dt = torch.bfloat16
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=dt) for _ in range(2))
    bias = torch.where(torch.rand(1, 1, 1, N, device="cuda") > 0.1, 0.0, float("-inf")).to(dt)
    out = torch.empty_like(q)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    lines = [f"B={B} N={N}: eager {graph_us(lambda i: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)):.2f} us"]
    strides = {"q": _strides(q), "k": _strides(k), "v": _strides(v), "bias": _strides(bias), "out": list(out.stride())}
    spec = ShortQueryAttentionSpec((B, Hq, 1, D, Hkv, N, D), dt, {"q": q, "k": k, "v": v, "bias": bias}, strides,
                                   "additive", False, 1 / math.sqrt(D), None)
    default = plan(spec, False)
    results = []
    for block_n, chunk, warps, stages in itertools.product((32, 64, 128), (64, 128, 256, 512), (4, 8), (1, 2)):
        if chunk < block_n:
            continue
        p = plan(spec, False, block_n=block_n, chunk=chunk)
        scratch, ls = launches(spec, False, p, warps, stages)
        bufs = [torch.empty(size, device="cuda", dtype=d) for d, size in scratch]
        args = [q, k, v, bias, out, *bufs]
        kernels = []
        try:
            for j, launch in enumerate(ls):
                mod = load_module(module_header(False) + launch.source(f"k{j}"), f"short_attention_probe_{j}")
                kernels.append((getattr(mod, f"k{j}"), tuple(launch.grid), launch.meta))

            def call():
                for fn, grid, meta in kernels:
                    fn[grid](*args, **meta)
            call()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = graph_us(lambda i: call())
        except Exception as e:  # noqa: BLE001 - a tiling that does not compile is skipped
            lines.append(f"   {block_n} {chunk} {warps} {stages} failed: {type(e).__name__}")
            continue
        results.append((us, block_n, chunk, warps, stages, p.splits, err))
    results.sort()
    mark = lambda r: " (default)" if (r[1], r[5]) == (default.block_n, default.splits) and r[3:5] == (4, 2) else ""  # noqa: E731
    lines += [f"   {us:.2f} us: BLOCK_N {bn}, chunk {ch}, warps {w}, stages {st}, splits {sp}, err {err:.1e}{mark((us, bn, ch, w, st, sp))}"
              for us, bn, ch, w, st, sp, err in results[:8]]
    lines += [f"   default: {r[0]:.2f} us" for r in results if mark(r)]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", default="208,1024,4096")
    ap.add_argument("--batch", default="1")
    a = ap.parse_args()
    for b in map(int, a.batch.split(",")):
        for n in map(int, a.keys.split(",")):
            probe(b, n)
