"""Host time of one Triton kernel launch, piece by piece (needs a CUDA GPU):
    python -m experiments.launch_probe
Times (us per call, best of rounds): torch.empty_strided on the GPU, Triton's JIT launch, the compiled
kernel's own launcher (`CompiledKernel.run`), torch's C launcher given the same kernel
(runtime/static_launch.py), ember's Launcher through each of the two, a wrapper line's call site
(`call_site`), and an ATen op. `--cpu`: the Python part of the launch paths alone, on any machine (a stand-in
launch function, CPU tensors)."""
import sys
import time

import torch
import triton
import triton.language as tl

from ember import config
from ember.runtime import launch as launch_mod
from ember.runtime.launch import Launcher, call_site
from ember.runtime.static_launch import static_launch


@triton.jit
def add_one(x_ptr, o_ptr, n, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(o_ptr + i, tl.load(x_ptr + i, i < n) + 1, i < n)


def us(f, calls=2000, rounds=10):
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def after_sync_us(f, calls=200):
    """Median host time of one call made right after the GPU went idle (as the anchor times it)."""
    ts = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e6


def site_of(L, meta):
    scope = {}
    scope["site"] = call_site(L, meta, lambda fn: scope.__setitem__("site", fn))
    return scope


def python_only():
    """The Python of ember's launch paths with the launch itself a no-op: six tensors and two ints, the
    shape of a fused BatchNorm kernel's call."""
    launch_mod._device_and_stream = lambda: (lambda: 0, lambda d: 0)

    class Stub:
        params = [type("P", (), {"name": f"a{i}", "is_constexpr": False}) for i in range(8)] + \
            [type("P", (), {"name": "XBLOCK", "is_constexpr": True})]

        def __getitem__(self, grid):
            return lambda *a, **m: type("K", (), {"run": print, "function": 1, "packed_metadata": 1})()
    ts = [torch.empty(1024) for _ in range(6)]
    args, meta = (*ts, 32, 1024), {"XBLOCK": 1024}
    with config.patch(static_launch=False):
        L = Launcher(Stub())
        L.launch((9,), args, meta)
        scope = site_of(L, meta)
        scope["site"]((9,), *args)
    for key in L.fast:
        L.fast[key] = lambda grid, stream, a: None
    site = scope["site"]
    site.__globals__["fast"].update({k: (lambda grid, stream, a: None) for k in site.__globals__["fast"]})
    res = {"launcher[grid](...)": lambda: L[(9,)](*args, XBLOCK=1024),
           "launcher.launch(grid, args, meta)": lambda: L.launch((9,), args, meta),
           "call site": lambda: site((9,), *args)}
    for name, f in res.items():
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(100000):
                f()
            best = min(best, (time.perf_counter() - t0) / 100000 * 1e6)
        print(f"{name:36s} {best:.3f} us")


def main():
    if "--cpu" in sys.argv:
        return python_only()
    x = torch.randn(1024, device="cuda")
    o = torch.empty_like(x)
    k = add_one[(1,)](x, o, 1024, XBLOCK=1024)
    stream = torch.cuda.current_stream().cuda_stream
    L = Launcher(add_one)
    L[(1,)](x, o, 1024, XBLOCK=1024)
    L[(1,)](x, o, 1024, XBLOCK=1024)
    with config.patch(static_launch=False):
        T = Launcher(add_one)
        T[(1,)](x, o, 1024, XBLOCK=1024)
    site = site_of(L, {"XBLOCK": 1024})
    site["site"]((1,), x, o, 1024)
    site["site"]((1,), x, o, 1024)
    go = static_launch(k, 3, 1)
    print("torch's C launcher takes the kernel:", go is not None)
    res = {
        "empty_strided": us(lambda: torch.empty_strided((1024,), (1,), dtype=torch.float32, device="cuda")),
        "aten add": us(lambda: torch.add(x, 1, out=o)),
        "triton JIT": us(lambda: add_one[(1,)](x, o, 1024, XBLOCK=1024)),
        "CompiledKernel.run": us(lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, x, o, 1024, 1024)),
        "CompiledKernel.run (int ptrs)": us(lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None,
                                                         x.data_ptr(), o.data_ptr(), 1024, 1024)),
        "C launcher": us(lambda: go((1,), stream, (x.data_ptr(), o.data_ptr(), 1024))) if go else float("nan"),
        "ember Launcher": us(lambda: L[(1,)](x, o, 1024, XBLOCK=1024)),
        "ember Launcher (Triton's run)": us(lambda: T[(1,)](x, o, 1024, XBLOCK=1024)),
        "call site": us(lambda: site["site"]((1,), x, o, 1024)),
        "current stream": us(lambda: torch._C._cuda_getCurrentRawStream(0)),
    }
    print("back to back: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()))
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    gelu = lambda a, b: torch.nn.functional.gelu(a + b)      # noqa: E731
    compiled = torch.compile(gelu, backend="ember")
    compiled(big, bias)
    res = {
        "noop": lambda: None,
        "empty_strided": lambda: torch.empty_strided((1024,), (1,), dtype=torch.float32, device="cuda"),
        "aten add (small)": lambda: torch.add(x, 1, out=o),
        "CompiledKernel.run (small)": lambda: k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None,
                                                    None, x, o, 1024, 1024),
        "C launcher (small)": (lambda: go((1,), stream, (x.data_ptr(), o.data_ptr(), 1024))) if go else (lambda: None),
        "ember Launcher (small)": lambda: L[(1,)](x, o, 1024, XBLOCK=1024),
        "ember Launcher, Triton's run (small)": lambda: T[(1,)](x, o, 1024, XBLOCK=1024),
        "call site (small)": lambda: site["site"]((1,), x, o, 1024),
        "eager add+gelu 8192^2": lambda: gelu(big, bias),
        "ember add+gelu 8192^2": lambda: compiled(big, bias),
    }
    print("after a sync:  " + ", ".join(f"{k} {after_sync_us(f):.2f}" for k, f in res.items()))
    print("torch._C._StaticCudaLauncher:", hasattr(torch._C, "_StaticCudaLauncher"))


if __name__ == "__main__":
    main()
