"""On a GPU: what the first call of each library op a ViT-B/16 inference graph calls costs in a fresh process
(cuBLAS, cuBLASLt's epilogue, cuDNN in either layout, SDPA), in the order given, each timed to a sync.

    python -m experiments.first_library_call_probe conv_nchw,conv_cl,mm,addmm_gelu,sdpa

A first call pays what the library loads or builds for that op (a handle, a kernel module, a runtime-compiled
engine); an op called before in the same process pays it no more. Run several orders in separate processes
to see which op pays what: a compiled graph's first call pays it too wherever it calls an op eager did not
(a convolution in channels-last where eager ran NCHW).
"""
import sys
import time

import torch
import torch.nn.functional as F


def ops():
    d, dt = "cuda", torch.bfloat16
    x = torch.randn(64, 3, 224, 224, device=d, dtype=dt)
    w = torch.randn(768, 3, 16, 16, device=d, dtype=dt)
    b = torch.randn(768, device=d, dtype=dt)
    a = torch.randn(64 * 197, 768, device=d, dtype=dt)
    wl = torch.randn(3072, 768, device=d, dtype=dt)
    bl = torch.randn(3072, device=d, dtype=dt)
    q = torch.randn(64, 12, 197, 64, device=d, dtype=dt)
    cl = torch.channels_last
    return {
        "conv_nchw": lambda: F.conv2d(x, w, b, stride=16),
        "conv_cl": lambda: F.conv2d(x.to(memory_format=cl), w.to(memory_format=cl), b, stride=16),
        "conv_cl_nobias": lambda: F.conv2d(x.to(memory_format=cl), w.to(memory_format=cl), None, stride=16),
        "mm": lambda: a @ wl.t(),
        "addmm": lambda: torch.addmm(bl, a, wl.t()),
        "addmm_gelu": lambda: torch.ops.aten._addmm_activation(bl, a, wl.t(), use_gelu=True),
        "sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
    }


def main() -> None:
    table = ops()
    torch.cuda.synchronize()
    for name in sys.argv[1].split(","):
        t0 = time.perf_counter()
        table[name]()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        table[name]()
        torch.cuda.synchronize()
        print(f"{name:16} first {first * 1e3:8.1f} ms, second {(time.perf_counter() - t0) * 1e3:7.2f} ms", flush=True)


if __name__ == "__main__":
    main()
