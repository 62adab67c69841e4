"""Cross-entropy's row statistics (max and sum of exp over 32000 classes, bf16 read as float32): raw Triton
variants against ember's kernel, kernel time by triton.testing.do_bench, % of a copy's bandwidth. Needs a
CUDA GPU:
    python -m experiments.cross_entropy_probe

Variants: `block` (ember's looped kernel: a block max per step, one exp per element),
`whole_row` (the row in registers: one read, no loop; RBLOCK 32768 at 16 or 32 warps), `block_split` (an unmasked loop over whole steps and a masked tail; with
`stages=` the loop is software-pipelined by Triton, tl.range's num_stages, the next steps' loads in flight
while one is reduced), `two_pass` (a max
loop, then a sum-of-exp loop that re-reads the row, mostly from L2), and ember's own kernel with whole rows
allowed (config.persistent_reduction_max=32768)."""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import ember
from ember.codegen.triton import helpers


@triton.jit
def ce_block(in_ptr, o0, o1, rnumel, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    rbase = tl.arange(0, RBLOCK)
    m = tl.full([1], float('-inf'), tl.float32)
    s = tl.zeros([RBLOCK], tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        r = roffset + rbase
        v = tl.load(in_ptr + row * rnumel + r, r < rnumel, other=float('-inf')).to(tl.float32)
        mn = helpers.maximum_nan(m, tl.reduce(v, 0, helpers.maximum_nan))
        sc = tl.where(m == mn, 1.0, tl.exp(m - mn))
        s = s * sc + tl.exp(v - tl.where(mn == float('-inf'), 0.0, mn))
        m = mn
    tl.store(o0 + row + tl.arange(0, 1), m)
    tl.store(o1 + row + tl.arange(0, 1), tl.sum(s, 0) + tl.zeros([1], tl.float32))


@triton.jit
def ce_block_split(in_ptr, o0, o1, rnumel, RBLOCK: tl.constexpr, XBLOCK: tl.constexpr, STAGES: tl.constexpr = 1):
    """ce_block with an unmasked loop over the full blocks and one masked step for the tail, exp as exp2 of
    one multiply-add, and XBLOCK rows per program."""
    LOG2E: tl.constexpr = 1.4426950408889634
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rbase = tl.arange(0, RBLOCK)[None, :]
    base = in_ptr + rows * rnumel
    m = tl.full([XBLOCK, 1], float('-inf'), tl.float32)
    s = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    full = (rnumel // RBLOCK) * RBLOCK
    for roffset in tl.range(0, full, RBLOCK, num_stages=STAGES):
        v = tl.load(base + roffset + rbase).to(tl.float32) * LOG2E
        mn = helpers.maximum_nan(m, tl.reduce(v, 1, helpers.maximum_nan)[:, None])
        sc = tl.where(m == mn, 1.0, tl.exp2(m - mn))
        s = s * sc + tl.exp2(v - tl.where(mn == float('-inf'), 0.0, mn))
        m = mn
    r = full + rbase
    v = tl.load(base + r, r < rnumel, other=float('-inf')).to(tl.float32) * LOG2E
    mn = helpers.maximum_nan(m, tl.reduce(v, 1, helpers.maximum_nan)[:, None])
    sc = tl.where(m == mn, 1.0, tl.exp2(m - mn))
    s = s * sc + tl.exp2(v - tl.where(mn == float('-inf'), 0.0, mn))
    tl.store(o0 + rows, mn / LOG2E)
    tl.store(o1 + rows, tl.sum(s, 1)[:, None])


@triton.jit
def ce_whole_row(in_ptr, o0, o1, rnumel, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    r = tl.arange(0, RBLOCK)
    v = tl.load(in_ptr + row * rnumel + r, r < rnumel, other=float('-inf')).to(tl.float32)
    m = tl.reduce(v, 0, helpers.maximum_nan)
    s = tl.sum(tl.exp(v - m), 0)
    tl.store(o0 + row, m)
    tl.store(o1 + row, s)


@triton.jit
def ce_two_pass(in_ptr, o0, o1, rnumel, RBLOCK: tl.constexpr):
    row = tl.program_id(0)
    rbase = tl.arange(0, RBLOCK)
    mx = tl.full([RBLOCK], float('-inf'), tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        r = roffset + rbase
        v = tl.load(in_ptr + row * rnumel + r, r < rnumel, other=float('-inf'), eviction_policy="evict_last")
        mx = helpers.maximum_nan(mx, v.to(tl.float32))
    m = tl.reduce(mx, 0, helpers.maximum_nan)
    s = tl.zeros([RBLOCK], tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        r = roffset + rbase
        v = tl.load(in_ptr + row * rnumel + r, r < rnumel, other=float('-inf'), eviction_policy="evict_first")
        s += tl.exp(v.to(tl.float32) - m)
    tl.store(o0 + row, m)
    tl.store(o1 + row, tl.sum(s, 0))


def main():
    x = torch.empty(2 ** 29, device="cuda")
    y = torch.empty_like(x)
    roof = 2 * x.numel() * 4 / do_bench(lambda: y.copy_(x)) / 1e6
    del x, y
    print(f"copy {roof:.0f} GB/s")
    T, V = 4096, 32000
    x = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
    o0, o1 = torch.empty(T, device="cuda"), torch.empty(T, device="cuda")
    rm = x.float().amax(1)
    rs = (x.float() - rm[:, None]).exp().sum(1)
    nb = x.numel() * 2

    def report(name, f):
        f()
        err = max((o0 - rm).abs().max().item(), ((o1 - rs).abs() / rs).max().item())
        ms = do_bench(f, warmup=25, rep=200)
        print(f"{name:28} {ms:.4f} ms  {100 * nb / ms / 1e6 / roof:5.1f}%  err {err:.3g}", flush=True)

    for rb, w in ((1024, 4), (2048, 8), (4096, 8), (4096, 16)):
        report(f"block ({rb},{w})", lambda: ce_block[(T,)](x, o0, o1, V, rb, num_warps=w))
    for rb, xb, w in ((4096, 1, 8), (2048, 1, 8), (2048, 1, 4), (1024, 1, 4), (1024, 2, 8), (512, 4, 8),
                      (1024, 4, 8), (512, 8, 8), (256, 8, 8), (4096, 1, 16)):
        report(f"block_split ({xb},{rb},{w})", lambda: ce_block_split[(T // xb,)](x, o0, o1, V, rb, xb, num_warps=w))
    for stages in (2, 3, 4):
        for rb, xb, w in ((2048, 1, 8), (1024, 1, 4), (1024, 2, 8), (512, 4, 8), (256, 8, 8), (4096, 1, 8)):
            report(f"block_split stages={stages} ({xb},{rb},{w})",
                   lambda: ce_block_split[(T // xb,)](x, o0, o1, V, rb, xb, stages, num_warps=w))
    for w in (8, 16, 32):
        report(f"whole_row (32768,{w})", lambda: ce_whole_row[(T,)](x, o0, o1, V, 32768, num_warps=w))
    for rb, w in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16)):
        report(f"two_pass ({rb},{w})", lambda: ce_two_pass[(T,)](x, o0, o1, V, rb, num_warps=w))

    # ember's whole cross-entropy (stats + loss), default against whole rows allowed
    t = torch.randint(0, V, (T,), device="cuda")
    ref = torch.nn.functional.cross_entropy(x.float(), t)
    for limit in (16384, 32768):
        torch._dynamo.reset()
        with ember.config.patch(persistent_reduction_max=limit):
            f = torch.compile(lambda a, b: torch.nn.functional.cross_entropy(a.float(), b), backend="ember")
            out = f(x, t)
        err = (out - ref).abs().item()
        ms = do_bench(lambda: f(x, t), warmup=25, rep=200)
        print(f"ember CE persistent<={limit:6} {ms:.4f} ms  {100 * nb / ms / 1e6 / roof:5.1f}% (wall, host included)  err {err:.3g}", flush=True)


if __name__ == "__main__":
    main()
