"""FlexAttention launch shapes on a GPU: each forward and backward config of ember's flex kernels, timed and
checked against a float32 reference, next to inductor's flex kernels and SDPA's fused kernels (flash, cuDNN,
memory-efficient, each forced, and SDPA's own choice, named by the kernels it ran).

    python -m experiments.flex_config_sweep [--dims 64,128] [--masks causal,sliding] [--out DIR]

bf16, B=4, H=16, seq 4096 (window 1024 for sliding), as benchmarks/flex_attention.py. A config is passed as
flex_attention's kernel_options (BLOCK_M/BLOCK_N for the forward, BLOCK_M2/BLOCK_N2 for dq, BLOCK_M1/BLOCK_N1
for dk/dv, num_warps, num_stages); every config runs on the --sweep-mask case, the other masks run the
defaults only. The GPU head-dim cap (flex_launch.GPU_MAX_HEAD_DIM) is lifted in this
process so larger head dims run ember's kernels. Per row: forward TFLOP/s, backward TFLOP/s (forward+backward
time minus forward time, 2.5x the forward's FLOPs), and the largest absolute error of the output and of each
gradient against float32 attention on the same bf16 inputs (SDPA with a dense mask). Results go to
DIR/flex_sweep.json and a table on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import ember
from benchmarks.kernels import timer
from ember.codegen.triton import flex_launch

_median_ms = timer("cuda", 10)     # median ms of a call, after warm-up calls

FWD = [(128, 128, 4, 3), (128, 64, 4, 2), (128, 128, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3), (64, 64, 4, 2)]
# (dq BLOCK_M2, BLOCK_N2, dk/dv BLOCK_M1, BLOCK_N1, warps, stages)
BWD = [(128, 64, 64, 128, 8, 3), (64, 64, 64, 64, 4, 3), (64, 64, 64, 128, 8, 3), (64, 64, 64, 64, 8, 3),
       (64, 64, 32, 128, 4, 3), (128, 64, 64, 128, 8, 2), (64, 64, 64, 64, 4, 2)]


def _mask_fn(name, window):
    if name == "causal":
        return lambda b, h, q, k: q >= k
    return lambda b, h, q, k: (q >= k) & (q - k <= window)


def _reference(q, k, v, dout, mask_name, window):
    S = q.shape[2]
    i = torch.arange(S, device=q.device)
    dense = i[:, None] >= i[None, :]
    if mask_name == "sliding":
        dense &= (i[:, None] - i[None, :]) <= window
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=dense)
    out.backward(dout.float())
    return out.detach(), [t.grad for t in leaves]


def _errors(out, grads, ref):
    errs = {"out": (out.float() - ref[0]).abs().max().item()}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[1]):
        errs[name] = (g.float() - r).abs().max().item()
    return errs


def _case(fn, q, k, v, dout, bm, options, flops):
    row = {}
    compiled = fn(options)
    try:
        with torch.no_grad():
            fwd_ms = _median_ms(lambda: compiled(q, k, v, bm))
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

        def step():
            for t in leaves:
                t.grad = None
            out = compiled(*leaves, bm)
            out.backward(dout)
            return out
        out = step()
        step_ms = _median_ms(step)
    except Exception as e:      # a config that does not compile or run is reported
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    row["fwd TFLOP/s"] = flops / fwd_ms / 1e9
    row["bwd TFLOP/s"] = 2.5 * flops / max(step_ms - fwd_ms, 1e-6) / 1e9
    row["out"], row["grads"] = out.detach(), [t.grad for t in leaves]
    return row


def _sdpa_backends() -> list:
    """(label, SDPA backends allowed) for SDPA's causal kernels: each fused kernel alone, then SDPA's own
    choice among all of them (which the row names, from the profiler's kernel names)."""
    return [("sdpa flash", [SDPBackend.FLASH_ATTENTION]), ("sdpa cudnn", [SDPBackend.CUDNN_ATTENTION]),
            ("sdpa efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("sdpa default", None)]


def _sdpa_row(q, k, v, dout, flops, backends) -> dict:
    ctx = (lambda: sdpa_kernel(backends)) if backends else contextlib.nullcontext
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def fwd():
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def step():
        with ctx():
            F.scaled_dot_product_attention(*leaves, is_causal=True).backward(dout)
    try:
        with torch.no_grad():
            ms = _median_ms(fwd)
        step_ms = _median_ms(step)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.no_grad():
                fwd()
            torch.cuda.synchronize()
        kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    except Exception as e:      # a backend that refuses these inputs is reported
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    return {"fwd TFLOP/s": flops / ms / 1e9, "bwd TFLOP/s": 2.5 * flops / (step_ms - ms) / 1e9,
            "kernels": [n[:90] for n in kernels]}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dims", default="64,128")
    p.add_argument("--masks", default="causal,sliding")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--sweep-mask", default="causal", help="the mask whose cases try every config")
    p.add_argument("--kinds", default="fwd,bwd", help="which configs to sweep")
    p.add_argument("--sweep-dims", default=None, help="head dims whose cases sweep (default: all)")
    p.add_argument("--quick", action="store_true", help="the first two configs of each kind")
    a = p.parse_args(argv)
    flex_launch.GPU_MAX_HEAD_DIM = 1 << 16
    B, H, S, window = 4, 16, 4096, 1024
    results = []
    fwd_cfgs, bwd_cfgs = (FWD[:2], BWD[:2]) if a.quick else (FWD, BWD)
    for D in [int(d) for d in a.dims.split(",")]:
        for mask_name in a.masks.split(","):
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            bm = create_block_mask(_mask_fn(mask_name, window), None, None, S, S, device="cuda")
            kept = bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum()
            density = float(kept) / (bm.kv_num_blocks.numel() * bm.kv_indices.shape[-1])
            flops = 4.0 * B * H * S * S * D * density
            ref = _reference(q, k, v, dout, mask_name, window)

            def ember_fn(options):
                torch._dynamo.reset()
                return torch.compile(lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm, kernel_options=options),
                                     backend="ember")

            def inductor_fn(options):
                torch._dynamo.reset()
                return torch.compile(lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm))

            cases = [("inductor", inductor_fn, None), ("ember default", ember_fn, {})]
            sweep_dims = [int(d) for d in (a.sweep_dims or a.dims).split(",")]
            if mask_name != a.sweep_mask or D not in sweep_dims:
                fwd_cfgs_here, bwd_cfgs_here = [], []
            else:
                fwd_cfgs_here = fwd_cfgs if "fwd" in a.kinds else []
                bwd_cfgs_here = bwd_cfgs if "bwd" in a.kinds else []
            cases += [(f"ember fwd {c}", ember_fn, dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), c)))
                      for c in fwd_cfgs_here]
            cases += [(f"ember bwd {c}", ember_fn, dict(zip(("BLOCK_M2", "BLOCK_N2", "BLOCK_M1", "BLOCK_N1",
                                                              "num_warps", "num_stages"), c))) for c in bwd_cfgs_here]
            for name, fn, options in cases:
                ember.metrics.reset()
                row = _case(fn, q, k, v, dout, bm, options, flops)
                if "out" in row:
                    row.update(_errors(row.pop("out"), row.pop("grads"), ref))
                if name.startswith("ember"):
                    row["fallbacks"] = sum(n for op, n in ember.metrics.fallbacks.items() if "flex" in op)
                row.update({"case": f"D={D} {mask_name}", "config": name})
                results.append(row)
                print(json.dumps(row), flush=True)
            if mask_name == "causal":
                for label, backends in _sdpa_backends():
                    row = _sdpa_row(q, k, v, dout, flops, backends)
                    row.update({"case": f"D={D} {mask_name}", "config": label})
                    results.append(row)
                    print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "flex_sweep.json"), "w") as f:
        json.dump(results, f, indent=1)
    cols = ["case", "config", "fwd TFLOP/s", "bwd TFLOP/s", "out", "dq", "dk", "dv", "fallbacks", "error"]
    for r in results:
        print("  ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
