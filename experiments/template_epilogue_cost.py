"""What an epilogue costs on the GEMM template's tile (GPU): the template kernel ember generates for
`gelu(x @ w.t() + b, approximate="tanh")` (8192x3072x768, bf16), timed as generated and with parts of its
epilogue removed, beside cuBLAS with a separate GELU kernel.

    python -m experiments.template_epilogue_cost

Finding (2026-11-26, H100, torch 2.11, Triton 3.6; docs/performance.md): with GELU spelled through
libdevice's tanh, 138.6 us as generated (BLOCK 128x128x64, 8 warps), 85.9 without the tanh, 76.8 with no
epilogue; cuBLAS's product alone 61.9 and with its GELU kernel 99.0. The tanh ran at the template's
occupancy (one 8-warp program per SM) instead of hidden under a memory-bound kernel's traffic; GELU is now
spelled v / (1 + exp(-2u)), and the variant below drops that exp.
"""
from __future__ import annotations

import importlib.util
import os
import re
import tempfile

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.codegen.triton.spelling import module_header
from ember.runtime.autotune import median_ms
from ember.runtime.template_choice import max_programs, template_grid

F = torch.nn.functional
M, N, K = 8192, 3072, 768
CONFIGS = [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
           dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
           dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)]


def fn(x, w, b):
    return (F.gelu(F.linear(x, w, b), approximate="tanh"),)


def bench_us(f) -> float:
    """us per call: the median of 20 samples of 10 back-to-back calls (ember's autotuning timer)."""
    return median_ms(f, samples=20) * 1e3


def load(source: str, name: str):
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(module_header(False) + source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    with ember.config.patch(gemm_templates="always", graph_cache=False):
        compiled = ember.compile_graph(make_fx(fn)(x, w, b), [x, w, b])
    (source,) = [gen.source for gen in compiled.kernels if "tl.dot(" in gen.source]
    name = re.search(r"def (\w+)\(", source).group(1)
    store = re.search(r"\n +tl\.store\(.*\n?$", source).group(0)
    epilogue_start = source.rindex("\n", 0, source.index("tmp0 = acc"))
    variants = {
        "as generated": source,
        "without exp": source.replace("tl.exp(", "("),
        "no epilogue": source[:epilogue_start] + re.sub(r"\(tmp\d+\)\.to", "acc.to", store),
    }
    ref = fn(x, w, b)[0]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    args = [{"x": x, "w": w, "b": b}[p] for p in _param_roles(source, compiled)] + [out]
    print(f"cuBLAS product alone {bench_us(lambda: x @ w.t()):.1f} us, with its GELU kernel "
          f"{bench_us(lambda: fn(x, w, b)):.1f} us")
    for label, src in variants.items():
        kernel = getattr(load(src, "variant"), name)
        times = []
        for cfg in CONFIGS:
            grid = template_grid((1, M, N, K), cfg, max_programs(x.device))
            times.append(round(bench_us(lambda: kernel[grid](*args, **cfg)), 1))
        check = ""
        if label == "as generated":
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            check = f"  (rel. error {err:.1e})"
        print(f"{label:14} us per config {times}{check}")


def _param_roles(source: str, compiled) -> list:
    """The graph inputs in the kernel's pointer order (its call in the wrapper names them)."""
    call = re.search(r"\w+\.run\(([^)]*)\)", compiled.source).group(1).split(", ")
    roles = {"arg0_1": "x", "arg1_1": "w", "arg2_1": "b"}
    return [roles[a] for a in call[:-1]]


if __name__ == "__main__":
    main()
