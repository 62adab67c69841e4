"""Does `ember report` measure a kernel as the kernel anchor does? For each memory-bound case of
../shared/bench/anchor_kernels.py that ember compiles to one kernel, this prints the kernel's % of the
memory roofline two ways:

  anchor   the anchor's method: 10 back-to-back calls between CUDA events, the anchor's byte count, against
           a 2 GiB float32 copy;
  report   the report's kernel table (`ember report`'s JSON beside the page): profiler time of the kernel,
           ember's byte count, against the report's own copy roofline.

Usage (a GPU): python benchmarks/report_roofline.py [--cases add_gelu_bf16,softmax_f32]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

from ember.report.roofline import cuda_seconds

M, N = 8192, 8192
bf, f32 = torch.bfloat16, torch.float32


def _mk(*shape, dtype=bf):
    return torch.randn(*shape, device="cuda", dtype=dtype)


# name -> (function, inputs, bytes the anchor counts): the anchor's cases that are one kernel in ember
CASES = {
    "add_gelu_bf16": (lambda x, b: F.gelu(x + b), lambda: (_mk(M, N), _mk(N)), lambda a: a[0].numel() * 2 * 2),
    "softmax_f32": (lambda x: torch.softmax(x, -1), lambda: (_mk(M, N, dtype=f32),), lambda a: a[0].numel() * 4 * 2),
    "layernorm_bf16": (lambda x, w, b: F.layer_norm(x, (N,), w, b), lambda: (_mk(M, N), _mk(N), _mk(N)),
                       lambda a: a[0].numel() * 2 * 2),
    "rmsnorm_residual_bf16": (lambda x, r, w: ((x + r) * torch.rsqrt((x + r).float().pow(2).mean(-1, keepdim=True)
                                                                     + 1e-6)).to(x.dtype) * w,
                              lambda: (_mk(M, N), _mk(M, N), _mk(N)), lambda a: a[0].numel() * 2 * 3),
    "sum_rows_f32": (lambda x: x.sum(1), lambda: (_mk(M, N, dtype=f32),), lambda a: a[0].numel() * 4),
    "transpose_add_f32": (lambda x, y: x.t() + y, lambda: (_mk(M, N, dtype=f32), _mk(M, N, dtype=f32)),
                          lambda a: a[0].numel() * 4 * 3),
}


def _events_ms(fn, args, samples=50, calls=10):
    """The anchor's timing: median ms of one call over samples of back-to-back calls."""
    return cuda_seconds(lambda: fn(*args), samples=samples, calls=calls) * 1e3


def anchor_fraction(name: str) -> float:
    x = torch.empty(2 ** 31 // 4, dtype=f32, device="cuda")
    y = torch.empty_like(x)
    copy_gbps = 2 * x.numel() * 4 / _events_ms(lambda: y.copy_(x), ()) / 1e6
    del x, y
    fn, mkargs, nbytes = CASES[name]
    args = mkargs()
    import ember  # noqa: F401  (registers the backend)
    f = torch.compile(fn, backend="ember")
    return nbytes(args) / _events_ms(f, args) / 1e6 / copy_gbps


def report_row(name: str) -> dict:
    """The case run under `EMBER_REPORT` in a fresh process; its slowest kernel's row."""
    with tempfile.TemporaryDirectory() as d:
        page = os.path.join(d, "r.html")
        env = dict(os.environ, EMBER_REPORT=page, EMBER_REPORT_STEPS="10", EMBER_REPORT_WARMUP="3")
        subprocess.run([sys.executable, __file__, "--run-case", name], env=env, check=True)
        with open(os.path.join(d, "r.json")) as f:
            table = json.load(f)
    kernels = [k for k in table["kernels"] if k["kind"] == "kernel" and k["seconds_per_step"]]
    row = max(kernels, key=lambda k: k["seconds_per_step"])
    row["kernel_count"] = len(kernels)
    return row


def run_case(name: str) -> None:
    import ember  # noqa: F401
    fn, mkargs, _ = CASES[name]
    args = mkargs()
    f = torch.compile(fn, backend="ember")
    for _ in range(16):
        f(*args)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--run-case")
    a = ap.parse_args()
    if a.run_case:
        return run_case(a.run_case)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'case':24}{'anchor %':>10}{'report %':>10}{'diff':>8}  kernels")
    for name in a.cases.split(","):
        anchor = 100 * anchor_fraction(name)
        row = report_row(name)
        rep = 100 * row["memory_roofline_fraction"]
        print(f"{name:24}{anchor:10.1f}{rep:10.1f}{rep - anchor:8.1f}  {row['kernel_count']}", flush=True)


if __name__ == "__main__":
    main()
