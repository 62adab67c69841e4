"""add+GELU in bf16 (8192 x 8192 plus a row bias, the anchor's case): is ember's kernel bound by memory or
by the erf's arithmetic? Raw Triton variants timed by triton.testing.do_bench (kernel time, launches back to
back), % of a copy's bandwidth. Needs a CUDA GPU:
    python scripts/gelu_probe.py

Variants: `copy` (load, convert, store: the floor of any bf16 pointwise kernel), `bias` (x + b, no GELU),
`poly` (ember's branchless erf, helpers.erf_f32), `libdevice` (libdevice.erf), `as7126` (Abramowitz-Stegun
7.1.26: one reciprocal, one exp, 5 FMAs), and `poly2d` (ember's erf in [rows, cols] tiles, the bias loaded
once per tile column), each at a few block sizes and warp counts; `persistent` (ember's erf, a fixed grid of
programs per SM looping over blocks, the loop software-pipelined by Triton with tl.range's num_stages); then ember's own compiled function."""
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ember  # noqa: E402
from ember.codegen.triton import helpers  # noqa: E402


@triton.jit
def _erf_as7126(x):
    a = tl.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = 1.061405429
    p = p * t + -1.453152027
    p = p * t + 1.421413741
    p = p * t + -0.284496736
    p = p * t + 0.254829592
    y = 1.0 - p * t * tl.exp2(-a * a * 1.4426950408889634)
    return tl.where(x < 0, -y, y)


@triton.jit
def _gelu(v, VARIANT: tl.constexpr):
    if VARIANT == 0:
        return v
    elif VARIANT == 1:
        return v * 0.5
    elif VARIANT == 2:
        return 0.5 * v * (1.0 + helpers.erf_f32(v * 0.7071067811865476))
    elif VARIANT == 3:
        return 0.5 * v * (1.0 + libdevice.erf(v * 0.7071067811865476))
    else:
        return 0.5 * v * (1.0 + _erf_as7126(v * 0.7071067811865476))


@triton.jit
def flat(x_ptr, b_ptr, o_ptr, N: tl.constexpr, VARIANT: tl.constexpr, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    v = tl.load(x_ptr + i).to(tl.float32)
    if VARIANT != 0:
        v = v + tl.load(b_ptr + i % N).to(tl.float32)
    tl.store(o_ptr + i, _gelu(v, VARIANT).to(tl.bfloat16))


@triton.jit
def tiled(x_ptr, b_ptr, o_ptr, N: tl.constexpr, VARIANT: tl.constexpr, YBLOCK: tl.constexpr,
          XBLOCK: tl.constexpr):
    rows = tl.program_id(1) * YBLOCK + tl.arange(0, YBLOCK)[:, None]
    cols = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[None, :]
    v = tl.load(x_ptr + rows * N + cols).to(tl.float32) + tl.load(b_ptr + cols).to(tl.float32)
    tl.store(o_ptr + rows * N + cols, _gelu(v, VARIANT).to(tl.bfloat16))


@triton.jit
def persistent(x_ptr, b_ptr, o_ptr, n_blocks, N: tl.constexpr, VARIANT: tl.constexpr, XBLOCK: tl.constexpr,
               STAGES: tl.constexpr):
    for blk in tl.range(tl.program_id(0), n_blocks, tl.num_programs(0), num_stages=STAGES):
        i = blk * XBLOCK + tl.arange(0, XBLOCK)
        v = tl.load(x_ptr + i).to(tl.float32) + tl.load(b_ptr + i % N).to(tl.float32)
        tl.store(o_ptr + i, _gelu(v, VARIANT).to(tl.bfloat16))


def main():
    import torch.nn.functional as F
    M = N = 8192
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    big = torch.empty(2 ** 29, device="cuda")
    roof = 2 * big.numel() * 4 / do_bench(lambda: torch.empty_like(big).copy_(big)) / 1e6
    del big
    nb = 2 * x.numel() * 2
    ref = F.gelu(x.float() + b.float())
    print(f"copy {roof:.0f} GB/s")
    names = ["copy", "bias", "poly", "libdevice", "as7126"]

    def report(name, fn, check):
        fn()
        err = (out.float() - ref).abs().max().item() if check else float("nan")
        ms = do_bench(fn, warmup=25, rep=200)
        print(f"{name:34} {ms * 1e3:7.1f} us  {100 * nb / ms / 1e6 / roof:5.1f}%  err {err:.3g}", flush=True)

    for variant, name in enumerate(names):
        for xb, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 16)]:
            report(f"{name} XBLOCK={xb} warps={w}",
                   lambda: flat[(x.numel() // xb,)](x, b, out, N, variant, xb, num_warps=w), variant >= 2)
    for yb, xb, w in [(8, 256, 4), (16, 256, 8), (4, 1024, 8), (8, 512, 8)]:
        report(f"poly2d {yb}x{xb} warps={w}",
               lambda: tiled[(N // xb, M // yb)](x, b, out, N, 2, yb, xb, num_warps=w), True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm, xb, w, stages in [(1, 1024, 4, 1), (1, 1024, 4, 3), (2, 1024, 4, 3), (4, 1024, 4, 2),
                                  (2, 2048, 4, 3), (4, 2048, 4, 2), (8, 1024, 4, 2), (2, 2048, 8, 4)]:
        nblk = x.numel() // xb
        report(f"persistent {per_sm}/SM XBLOCK={xb} w={w} st={stages}",
               lambda: persistent[(sms * per_sm,)](x, b, out, nblk, N, 2, xb, stages, num_warps=w), True)
    f = torch.compile(lambda x, b: F.gelu(x + b), backend="ember")
    f(x, b)
    ms = do_bench(lambda: f(x, b), warmup=25, rep=200)
    print(f"{'ember compiled (wall)':34} {ms * 1e3:7.1f} us  {100 * nb / ms / 1e6 / roof:5.1f}%", flush=True)


if __name__ == "__main__":
    main()
