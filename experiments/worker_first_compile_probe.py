"""What a compile worker's first Triton compile costs beyond later ones. Needs a CUDA GPU (for the target).

    python -m experiments.worker_first_compile_probe

Starts fresh Python processes like ember's compile workers (runtime/compile_worker.py: Triton's driver
replaced by one that answers the parent's target, no CUDA context), each with an empty Triton cache, and
times in each: importing torch and Triton's compiler, Triton's key of its installation, then the compiles of
several different small kernels one after another (`JITFunction.warmup`, as a worker's job runs it). The
first compile's excess over the later ones is what a worker pays once (docs/performance.md: about 0.1 s on
an H200, against 3.1-3.9 s of imports).
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent('''
    import json, sys, time
    t0 = time.perf_counter()
    import torch, triton, triton.language as tl
    import triton.compiler.compiler
    import triton.backends.nvidia.compiler
    t_import = time.perf_counter() - t0
    import importlib.util
    spec = importlib.util.spec_from_file_location("compile_worker", sys.argv[2])
    compile_worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_worker)
    CompileOnlyDriver = compile_worker.CompileOnlyDriver
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    driver.set_active(CompileOnlyDriver(GPUTarget(*json.loads(sys.argv[1]))))
    t0 = time.perf_counter()
    from triton.runtime.cache import triton_key
    triton_key()
    t_key = time.perf_counter() - t0

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, i < n) + tl.load(y + i, i < n), i < n)

    @triton.jit
    def gelu(x, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + i, i < n).to(tl.float32)
        tl.store(out + i, v / (1.0 + tl.exp(-1.5957691216 * (v + 0.044715 * v * v * v))), i < n)

    @triton.jit
    def rowsum(x, out, n, R: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        c = tl.arange(0, BLOCK)
        tl.store(out + r, tl.sum(tl.load(x + r * R + c, c < R, other=0.0).to(tl.float32), 0))

    times = []
    for fn, args, meta in [(add, (torch.float32, torch.float32, torch.float32, 1024), dict(BLOCK=1024)),
                           (gelu, (torch.bfloat16, torch.bfloat16, 4096), dict(BLOCK=1024)),
                           (rowsum, (torch.bfloat16, torch.float32, 64), dict(R=768, BLOCK=1024)),
                           (add, (torch.bfloat16, torch.bfloat16, torch.bfloat16, 1024), dict(BLOCK=512)),
                           (gelu, (torch.float32, torch.float32, 4096), dict(BLOCK=2048))]:
        t0 = time.perf_counter()
        fn.warmup(*args, grid=(1,), **meta)
        times.append(round(time.perf_counter() - t0, 3))
    print(json.dumps({"import_s": round(t_import, 3), "triton_key_s": round(t_key, 3), "compiles_s": times}))
''')


def main() -> None:
    import torch
    from triton.runtime import driver
    t = driver.active.get_current_target()
    target = json.dumps([t.backend, t.arch, t.warp_size])
    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ember", "runtime",
                          "compile_worker.py")
    assert torch.cuda.is_available()
    for i in range(3):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            env.pop("TRITON_INTERPRET", None)
            child = os.path.join(cache, "child.py")       # Triton reads a kernel's source from its file
            with open(child, "w") as f:
                f.write(CHILD)
            p = subprocess.run([sys.executable, child, target, worker], env=env, capture_output=True,
                               text=True, timeout=300)
            print(f"process {i}:", p.stdout.strip() or p.stderr.strip()[-2000:], flush=True)


if __name__ == "__main__":
    main()
