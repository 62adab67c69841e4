"""Raw Triton variants of two anchor kernels, kernel time by triton.testing.do_bench (ms) and % of copy:
add+GELU bf16 (libdevice erf vs a branchless polynomial erf vs tanh) and the cross-entropy row stats
(a block max per iteration; experiments/cross_entropy_probe.py has more variants). Needs a CUDA GPU:
    python -m experiments.kernel_variants_probe
What it found is in docs/performance.md ("What limits each number")."""
import torch, triton, triton.language as tl
from triton.language.extra import libdevice
from triton.testing import do_bench
from ember.codegen.triton import helpers

erf_poly = helpers.erf_f32      # what ember generates for float32 erf


@triton.jit
def gelu_k(x_ptr, b_ptr, o_ptr, n, N: tl.constexpr, MODE: tl.constexpr, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    m = i < n
    x = tl.load(x_ptr + i, m, other=0).to(tl.float32) + tl.load(b_ptr + (i % N), m, other=0).to(tl.float32)
    if MODE == 0:
        y = x
    elif MODE == 1:
        y = 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476))
    elif MODE == 2:
        y = 0.5 * x * (1.0 + erf_poly(x * 0.7071067811865476))
    else:
        y = 0.5 * x * (1.0 + libdevice.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    tl.store(o_ptr + i, y.to(tl.bfloat16), m)

@triton.jit
def ce_block(in_ptr, o0, o1, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, NANMAX: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    m = tl.full([XBLOCK, 1], float('-inf'), tl.float32)
    s = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        v = tl.load(in_ptr + (rindex + rnumel * xindex), xmask & rmask, other=0).to(tl.float32)
        vm = tl.where(xmask & rmask, v, float('-inf'))
        if NANMAX:
            bm = tl.reduce(vm, 1, helpers.max_nan)[:, None]
            mn = helpers.max_nan(m, bm)
        else:
            bm = tl.max(vm, 1)[:, None]
            mn = tl.maximum(m, bm)
        scale = tl.where(m == mn, 1.0, tl.exp(m - mn))
        ms = tl.where(mn == float('-inf'), 0.0, mn)
        s = s * scale + tl.exp(vm - ms)
        m = mn
    r1 = tl.sum(s, 1)[:, None]
    r1 = tl.where(m == float('-inf'), float('nan'), r1)
    tl.store(o0 + xindex, m, xmask)
    tl.store(o1 + xindex, r1, xmask)


def main():
    x = torch.empty(2 ** 29, device="cuda"); y = torch.empty_like(x)
    roof = 2 * x.numel() * 4 / do_bench(lambda: y.copy_(x)) / 1e6
    del x, y
    print(f"copy {roof:.0f} GB/s")
    M, N = 8192, 8192
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16); b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(x)
    ref = torch.nn.functional.gelu(x.float() + b.float())
    nb = x.numel() * 4
    for mode, name in ((0, "add"), (1, "gelu_libdevice"), (2, "gelu_poly"), (3, "gelu_tanh")):
        for xb, w in ((1024, 4), (2048, 8), (1024, 8), (512, 4), (4096, 8)):
            f = lambda: gelu_k[(triton.cdiv(x.numel(), xb),)](x, b, o, x.numel(), N, mode, xb, num_warps=w)
            f()
            err = (o.float() - (x.float() + b.float() if mode == 0 else ref)).abs().max().item()
            ms = do_bench(f, warmup=25, rep=200)
            print(f"{name:16} XBLOCK {xb:5} w{w:2}  {ms:.4f} ms  {100 * nb / ms / 1e6 / roof:5.1f}%  maxerr {err:.3g}", flush=True)
    # erf accuracy of the polynomial on the GPU, against float64
    t = torch.linspace(-6, 6, 2 ** 24, device="cuda")
    e = torch.empty_like(t)
    @triton.jit
    def erf_k(a, o, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(o + i, erf_poly(tl.load(a + i, i < n)), i < n)
    erf_k[(triton.cdiv(t.numel(), 1024),)](t, e, t.numel(), 1024)
    ref64 = torch.erf(t.double())
    ulp = (e.double() - ref64).abs() / torch.finfo(torch.float32).eps / ref64.abs().clamp_min(1e-30).pow(1).mul(1.0)
    print("erf_poly max abs err", (e.double() - ref64).abs().max().item(), " torch.erf f32 max abs err", (torch.erf(t).double() - ref64).abs().max().item(),
          " max rel err (|x|>1e-3)", ((e.double() - ref64).abs() / ref64.abs())[t.abs() > 1e-3].max().item())
    # cross-entropy stats
    T, V = 4096, 32000
    x = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
    o0 = torch.empty(T, device="cuda"); o1 = torch.empty(T, device="cuda")
    rm = x.float().amax(1); rs = (x.float() - rm[:, None]).exp().sum(1)
    nb = x.numel() * 2
    for kname in ("block", "block_nanmax"):
        for xb, rb, w in ((1, 1024, 4), (1, 2048, 8), (1, 4096, 8), (1, 4096, 16), (2, 1024, 8), (1, 8192, 16), (4, 512, 8)):
            f = lambda: ce_block[(T // xb,)](x, o0, o1, T, V, xb, rb, kname == "block_nanmax", num_warps=w)
            f()
            err = max((o0 - rm).abs().max().item(), ((o1 - rs).abs() / rs).max().item())
            ms = do_bench(f, warmup=25, rep=200)
            print(f"ce_{kname:12} ({xb},{rb},{w:2})  {ms:.4f} ms  {100 * nb / ms / 1e6 / roof:5.1f}%  err {err:.3g}", flush=True)


if __name__ == "__main__":
    main()
