"""FlexAttention's forward kernel, raw variants of its structure against SDPA's flash kernel (GPU only).

    python -m experiments.flex_forward_probe [--dims 64,128] [--modes ptr,ptr_t,tma] [--configs all|128x64x4x2,...]

The kernels here walk a causal BlockMask the way ember's generated forward does (a flat loop over the
listed partial blocks with the mask applied, then the full blocks without it; online softmax in base 2) and
differ in how they read their tiles:
- "ptr": pointer loads, K read transposed ([D, BLOCK_N] through its strides), as ember's kernel reads it;
- "ptr_t": K read as [BLOCK_N, D] tiles and transposed in registers (`tl.trans`);
- "tma": Q, K, V read and the output written through host-built tensor descriptors (Hopper's TMA).
Each variant runs over a grid of launch shapes; the table gives TFLOP/s of back-to-back kernel launches
(causal FLOPs: 4 * B * H * S * S * D * kept density), the largest error against SDPA's flash output, and,
timed the same way, SDPA's flash kernel and ember's and inductor's compiled flex_attention (these also timed
one call at a time, host time included). bf16, B=4, H=16, S=4096.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchmarks.kernels import timer

_one_call_ms = timer("cuda", 20)     # median ms of one call between events, after a sync
MODES = {"ptr": 0, "ptr_t": 1, "tma": 2}
CONFIGS = [(128, 128, 4, 3), (128, 64, 4, 3), (128, 64, 4, 2), (128, 128, 8, 3), (128, 64, 8, 3),
           (128, 128, 8, 4), (128, 64, 4, 4)]


@triton.jit
def _load_kt(K, desc_k, row, offs_n, offs_d, D: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    if MODE == 2:
        return tl.trans(desc_k.load([row, 0]))
    elif MODE == 1:
        return tl.trans(tl.load(K + offs_n[:, None] * D + offs_d[None, :]))
    else:
        return tl.load(K + offs_n[None, :] * D + offs_d[:, None])


@triton.jit
def _load_v(V, desc_v, row, offs_n, offs_d, D: tl.constexpr, MODE: tl.constexpr):
    if MODE == 2:
        return desc_v.load([row, 0])
    else:
        return tl.load(V + offs_n[:, None] * D + offs_d[None, :])


@triton.jit
def _step(q, K, V, desc_k, desc_v, base, start, offs_m, offs_d, m_i, l_i, acc, scale2,
          D: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, MASKED: tl.constexpr):
    offs_n = start + tl.arange(0, BLOCK_N)
    kt = _load_kt(K, desc_k, base + start, base + offs_n, offs_d, D, BLOCK_N, MODE)
    qk = tl.dot(q, kt)
    if MASKED:
        s2 = tl.where(offs_m[:, None] >= offs_n[None, :], qk * scale2, float("-inf"))
    else:
        s2 = qk * scale2
    m_new = tl.maximum(m_i, tl.max(s2, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s2 - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_v(V, desc_v, base + start, base + offs_n, offs_d, D, MODE)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def flex_like_forward(Q, K, V, O, desc_q, desc_k, desc_v, desc_o, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, scale2,
                      S: tl.constexpr, D: tl.constexpr, SPARSE: tl.constexpr, NBLK: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * S
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if MODE == 2:
        q = desc_q.load([base + pid_m * BLOCK_M, 0])
    else:
        q = tl.load(Q + (base + offs_m)[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    row = (pid_m * BLOCK_M) // SPARSE
    steps: tl.constexpr = SPARSE // BLOCK_N
    n = tl.load(KV_NUM + row) * steps
    for t in range(0, n):
        start = tl.load(KV_IDX + row * NBLK + t // steps) * SPARSE + (t % steps) * BLOCK_N
        m_i, l_i, acc = _step(q, K, V, desc_k, desc_v, base, start, offs_m, offs_d, m_i, l_i, acc, scale2,
                              D, BLOCK_N, MODE, True)
    n = tl.load(FULL_NUM + row) * steps
    for t in range(0, n):
        start = tl.load(FULL_IDX + row * NBLK + t // steps) * SPARSE + (t % steps) * BLOCK_N
        m_i, l_i, acc = _step(q, K, V, desc_k, desc_v, base, start, offs_m, offs_d, m_i, l_i, acc, scale2,
                              D, BLOCK_N, MODE, False)
    out = (acc / l_i[:, None]).to(Q.dtype.element_ty)
    if MODE == 2:
        desc_o.store([base + pid_m * BLOCK_M, 0], out)
    else:
        tl.store(O + (base + offs_m)[:, None] * D + offs_d[None, :], out)


def _bench_ms(fn, iters=50) -> float:
    """Median over 5 rounds of `iters` back-to-back calls, ms per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        rounds.append(s.elapsed_time(e) / iters)
    return statistics.median(rounds)


def _timed(fn, flops) -> dict:
    # one call at a time as benchmarks/flex_attention.py times it, host time included
    return {"TFLOP/s": flops / _bench_ms(fn) / 1e9, "one call TFLOP/s": flops / _one_call_ms(fn) / 1e9}


def _kernels(fn) -> list:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:80] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def run_variant(mode, cfg, q, k, v, bm, scale):
    from triton.tools.tensor_descriptor import TensorDescriptor
    B, H, S, D = q.shape
    bm_, bn, warps, stages = cfg
    out = torch.empty_like(q)
    flat = [t.view(B * H * S, D) for t in (q, k, v, out)]
    if MODES[mode] == 2:
        descs = [TensorDescriptor(t, [B * H * S, D], [D, 1], [bm_ if i in (0, 3) else bn, D])
                 for i, t in enumerate(flat)]
    else:
        descs = flat
    sparse = bm.BLOCK_SIZE[1]
    grid = (S // bm_, B * H)
    args = (*flat, *descs, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
            scale * 1.4426950408889634)

    def call():
        flex_like_forward[grid](*args, S=S, D=D, SPARSE=sparse, NBLK=bm.kv_indices.shape[-1], BLOCK_M=bm_,
                                BLOCK_N=bn, MODE=MODES[mode], num_warps=warps, num_stages=stages)
    call()
    return out, call


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--modes", default="ptr,ptr_t,tma")
    ap.add_argument("--configs", default="all", help="all, or BLOCK_MxBLOCK_NxWARPSxSTAGES,...")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    import ember  # noqa: F401 - registers the backend
    B, H, S = 4, 16, 4096
    rows = []
    for D in [int(d) for d in a.dims.split(",")]:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cuda")
        kept = bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum()
        flops = 4.0 * B * H * S * S * D * float(kept) / (bm.kv_num_blocks.numel() * bm.kv_indices.shape[-1])
        scale = D ** -0.5
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.no_grad():
            def flash():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ref = flash()
            rows.append({"D": D, "variant": "sdpa flash", **_timed(flash, flops), "kernels": _kernels(flash)})
        for backend in ("ember", "inductor"):
            torch._dynamo.reset()
            fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), backend=backend)
            with torch.no_grad():
                got = fn(q, k, v)
                row = _timed(lambda: fn(q, k, v), flops)
            rows.append({"D": D, "variant": f"{backend} flex", **row,
                         "err": (got.float() - ref.float()).abs().max().item()})
        cfgs = CONFIGS if a.configs == "all" else [tuple(int(n) for n in c.split("x")) for c in a.configs.split(",")]
        for mode in a.modes.split(","):
            for cfg in cfgs:
                try:
                    got, call = run_variant(mode, cfg, q, k, v, bm, scale)
                    ms = _bench_ms(call)
                    row = {"TFLOP/s": flops / ms / 1e9, "err": (got.float() - ref.float()).abs().max().item()}
                except Exception as e:  # noqa: BLE001 - a launch shape that does not compile is reported
                    row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
                rows.append({"D": D, "variant": f"{mode} {cfg}", **row})
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(a.out, "flex_forward_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        print(f"D={r['D']:<4} {r['variant']:<28} " + (f"{r['TFLOP/s']:7.1f} TFLOP/s" if "TFLOP/s" in r else r["error"])
              + (f" (one call {r['one call TFLOP/s']:.1f})" if "one call TFLOP/s" in r else "")
              + (f"  err {r['err']:.2e}" if "err" in r else "") + (f"  {r['kernels']}" if "kernels" in r else ""))


if __name__ == "__main__":
    main()
