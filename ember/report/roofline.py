"""The machine's rooflines, measured where the report runs: memory bandwidth from a large device copy (read
once, written once: 2 x its bytes per copy), and FLOP/s from a large matrix product in each dtype the
report needs. A GPU is timed with CUDA events around back-to-back calls, the median of several samples;
the CPU with the wall clock, the best of several (the machine may be shared)."""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import torch

GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 64 << 20          # larger than the last-level caches of usual CPUs
GPU_GEMM = {torch.float32: 4096, torch.float16: 8192, torch.bfloat16: 8192}
CPU_GEMM = {torch.float32: 1024, torch.float16: 512, torch.bfloat16: 512}


@dataclasses.dataclass
class Roofline:
    device: str                    # "cuda:0 (NVIDIA H100 80GB HBM3)", "cpu (2 threads)"
    copy_gbps: float
    gemm_tflops: dict              # dtype -> TFLOP/s of a matrix product in that dtype (torch's matmul settings)
    vector_tflops: float           # float32 without TF32: what a kernel's own arithmetic (not a tensor core) can reach
    how: str                       # what was measured, for the page

    def peak_tflops(self, dtype: Optional[torch.dtype]) -> float:
        """The peak an extern in `dtype` is compared with; an ember kernel (dtype None) has the vector peak."""
        if dtype is None:
            return self.vector_tflops
        return self.gemm_tflops.get(dtype) or self.vector_tflops


def measure(device: torch.device, dtypes=()) -> Roofline:
    """Rooflines for `device`, with a GEMM peak for each floating dtype in `dtypes` (float32 always)."""
    wanted = [torch.float32] + [d for d in dict.fromkeys(dtypes) if d in GPU_GEMM and d != torch.float32]
    if device.type == "cuda":
        return _measure_cuda(device, wanted)
    return _measure_cpu(wanted)


def _measure_cuda(device, dtypes) -> Roofline:
    with torch.cuda.device(device):
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(GPU_COPY_BYTES, free // 4) // 4 * 4
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        copy_s = cuda_seconds(lambda: dst.copy_(src))
        del src, dst
        gemm = {d: _cuda_gemm_tflops(device, d, GPU_GEMM[d]) for d in dtypes}
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            vector = _cuda_gemm_tflops(device, torch.float32, GPU_GEMM[torch.float32])
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        name = torch.cuda.get_device_name(device)
    how = (f"copy of {nbytes >> 20} MiB (float32), median of 20 samples of 5 back-to-back copies; "
           f"GEMM: n x n x n products ({', '.join(f'{_short(d)} n={GPU_GEMM[d]}' for d in dtypes)}) with torch's "
           f"matmul settings; vector peak: float32 n={GPU_GEMM[torch.float32]} with TF32 off")
    return Roofline(f"{device} ({name})", 2 * nbytes / copy_s / 1e9, gemm, vector, how)


def cuda_seconds(fn, samples: int = 20, calls: int = 5) -> float:
    """Median seconds of one call of fn on the GPU: `samples` samples of `calls` back-to-back calls each."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    times.sort()
    return times[len(times) // 2]


def _cuda_gemm_tflops(device, dtype, n) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = cuda_seconds(lambda: torch.mm(a, b), samples=10, calls=3)
    return 2 * n ** 3 / seconds / 1e12


def _cpu_seconds(fn, samples: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _measure_cpu(dtypes) -> Roofline:
    src = torch.rand(CPU_COPY_BYTES // 4)
    dst = torch.empty_like(src)
    copy_s = _cpu_seconds(lambda: dst.copy_(src))
    gemm = {}
    for d in dtypes:
        n = CPU_GEMM[d]
        a, b = torch.randn(n, n).to(d), torch.randn(n, n).to(d)
        gemm[d] = 2 * n ** 3 / _cpu_seconds(lambda: torch.mm(a, b), samples=3) / 1e12
    how = (f"copy of {CPU_COPY_BYTES >> 20} MiB (float32) with torch's {torch.get_num_threads()} threads, best of 5; "
           f"GEMM: n x n x n products ({', '.join(f'{_short(d)} n={CPU_GEMM[d]}' for d in dtypes)}), best of 3; "
           f"vector peak: the float32 product's")
    return Roofline(f"cpu ({torch.get_num_threads()} threads)", 2 * CPU_COPY_BYTES / copy_s / 1e9, gemm,
                    gemm[torch.float32], how)


def _short(dtype) -> str:
    return str(dtype).replace("torch.", "")
