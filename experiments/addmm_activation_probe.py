"""cuBLASLt's fused bias + activation epilogue (`aten._addmm_activation`) against a product and a separate
activation kernel, on the GEMM anchor's shapes: time per call (10 back-to-back calls between two events)
and error against a float64 product with the activation in float64.

    python -m experiments.addmm_activation_probe [--dtypes bfloat16,float16,float32]

Columns: `addmm + act` is what eager runs (cuBLAS's product with its bias epilogue, then the activation as
an ATen kernel); `addmm` the product with its bias alone; `lt act` `_addmm_activation` with the activation
in cuBLASLt's epilogue. Errors are the relative Frobenius norm against the float64 result; for GELU both
against the tanh form (what the case asks for) and the exact form.
"""
import argparse

import torch
import torch.nn.functional as F

from ember.report.roofline import cuda_seconds

SHAPES = {"gpt2_fc": (8192, 3072, 768), "llama_gate_up": (8192, 5632, 1024), "bert_ffn_in": (8192, 3072, 768),
          "small": (512, 1024, 256), "odd": (1000, 3001, 769)}


def per_call(fn) -> float:
    """Median us of one call: 30 samples of 10 back-to-back calls."""
    return cuda_seconds(fn, samples=30, calls=10) * 1e6


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{'case':14} {'dtype':9} {'act':5} {'addmm+act us':>13} {'addmm us':>9} {'lt act us':>10}"
          f" {'err eager':>10} {'err lt':>9} {'lt vs exact':>11}")
    for dname in a.dtypes.split(","):
        dt = getattr(torch, dname)
        for case, (M, N, K) in SHAPES.items():
            torch.manual_seed(0)
            x = torch.randn(M, K, device="cuda", dtype=dt) / 8
            w = torch.randn(N, K, device="cuda", dtype=dt) / 8
            b = torch.randn(N, device="cuda", dtype=dt) / 8
            h64 = torch.addmm(b.double(), x.double(), w.double().t())
            for act in ("gelu", "relu"):
                if act == "gelu":
                    ref = F.gelu(h64, approximate="tanh")
                    exact = F.gelu(h64)
                    eager = lambda: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")
                else:
                    ref = exact = torch.relu(h64)
                    eager = lambda: torch.relu(torch.addmm(b, x, w.t()))
                lt = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=act == "gelu")
                t_eager, t_mm, t_lt = per_call(eager), per_call(lambda: torch.addmm(b, x, w.t())), per_call(lt)
                out_lt = lt()
                print(f"{case:14} {dname:9} {act:5} {t_eager:13.1f} {t_mm:9.1f} {t_lt:10.1f} "
                      f"{rel(eager(), ref):10.2e} {rel(out_lt, ref):9.2e} {rel(out_lt, exact):11.2e}", flush=True)


if __name__ == "__main__":
    main()
