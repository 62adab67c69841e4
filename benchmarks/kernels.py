"""Memory-bound kernels: time per call and achieved bandwidth of eager, inductor and ember, against a
measured copy roofline, with each backend's result checked against eager.

    python -m benchmarks.kernels --backends eager,inductor,ember [--out results.json]    # on a GPU
    python -m benchmarks.kernels --device cpu --small --backends eager,ember              # CPU smoke test
    ember bench ARGS                                                                       # the same, from the CLI

Bytes moved = every tensor input read once + every output written once: the least any kernel (or set of
kernels) computing the case must move, so GB/s is comparable across backends and against a copy.
A backend spec is `eager`, a torch.compile backend name (`inductor`, `ember`), or `module:attr`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import ember  # before triton is imported: sets TRITON_INTERPRET=1 without a GPU
from torch.utils._pytree import tree_leaves

bf16, f32 = torch.bfloat16, torch.float32


def tensors(tree) -> list:
    """The tensors in a nest of tuples, lists and dicts, in order. (The other benchmarks import it from here;
    this file imports nothing from theirs, because `ember bench` runs it by path, outside the package.)"""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def rmsnorm_residual(x, r, w):
    h = x + r
    y = (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    return h, y                        # the fused add+RMSNorm of a transformer block returns both


def chain(x):
    return ((x * 2 + 1).sin() * x.cos()).relu()


def cases(dev: str, small: bool):
    """(name, fn, make_args) for each case; sizes large enough to be bandwidth-bound on a GPU."""
    M, N = (64, 256) if small else (8192, 8192)
    V, T = (1000, 64) if small else (32000, 4096)       # cross-entropy vocabulary, tokens
    LM, LN = (32, 512) if small else (16384, 4096)      # norm layers: many rows of a typical hidden size

    def mk(*shape, dtype=bf16):
        return torch.randn(*shape, device=dev, dtype=dtype)

    yield "add_gelu_bf16", lambda x, b: F.gelu(x + b), lambda: (mk(M, N), mk(N))
    yield "softmax_f32", lambda x: torch.softmax(x, -1), lambda: (mk(M, N, dtype=f32),)
    yield "layernorm_bf16", lambda x, w, b: F.layer_norm(x, (LN,), w, b), lambda: (mk(LM, LN), mk(LN), mk(LN))
    yield "rmsnorm_residual_bf16", rmsnorm_residual, lambda: (mk(LM, LN), mk(LM, LN), mk(LN))
    yield "sum_rows_f32", lambda x: x.sum(1), lambda: (mk(M, N, dtype=f32),)
    yield "sum_cols_f32", lambda x: x.sum(0), lambda: (mk(M, N, dtype=f32),)
    yield "sum_all_f32", lambda x: x.sum(), lambda: (mk(4 * M, N, dtype=f32),)
    yield "cross_entropy_bf16", lambda x, t: F.cross_entropy(x.float(), t), \
        lambda: (mk(T, V), torch.randint(0, V, (T,), device=dev))
    yield "transpose_add_f32", lambda x, y: x.t() + y, lambda: (mk(M, N, dtype=f32), mk(N, M, dtype=f32))
    yield "chain_f32", chain, lambda: (mk(M * N, dtype=f32),)
    yield "tiny_chain_f32", chain, lambda: (mk(1024, dtype=f32),)       # launch-bound, not memory-bound


# -- measuring -----------------------------------------------------------------------------------------------

def timer(dev: str, iters: int):
    def cuda(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    def cpu(fn) -> float:
        fn()
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)
    return cuda if dev == "cuda" else cpu


def device_ms(fn, calls: int = 20):
    """Milliseconds of GPU work one call launches, from the profiler's device-side kernel durations: the
    call's time with its host work (guards, wrappers, launches) left out. None off a GPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
             for e in prof.key_averages())
    return us / 1e3 / calls


def copy_roofline(dev: str, small: bool, time_ms) -> float:
    """GB/s of a large device copy (read + write): the practical ceiling for a memory-bound kernel."""
    n = (2 ** 26 if small else 2 ** 29) // 4 * (1 if dev == "cpu" else 4)   # 64 MiB on CPU, 2 GiB on GPU
    x = torch.empty(n, dtype=f32, device=dev).uniform_()
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / ms / 1e6



def nbytes(args, out) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(args) + tensors(out))


def mismatch(out, ref) -> str | None:
    """None when out matches ref within a tolerance fitting the dtype, else what differs."""
    outs, refs = tensors(out), tensors(ref)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, eager has {len(refs)}"
    for i, (a, e) in enumerate(zip(outs, refs)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
        # bf16 results differ by an ulp (2^-8) when rounded from a differently ordered f32 computation;
        # f32 reductions over millions of elements differ by accumulation order
        rtol, atol = {bf16: (2e-2, 2e-2), torch.float16: (1e-2, 1e-2)}.get(e.dtype, (1e-4, 1e-4))
        atol *= max(1.0, e.float().abs().max().item()) if e.numel() else 1.0
        if not torch.allclose(a.float(), e.float(), rtol=rtol, atol=atol, equal_nan=True):
            err = (a.float() - e.float()).abs().max().item()
            return f"output {i}: max abs error {err:.3g} (atol {atol:.3g}, rtol {rtol})"
    return None


def resolve(spec: str):
    if spec == "eager":
        return None
    if ":" in spec:
        mod, attr = spec.split(":")
        return getattr(importlib.import_module(mod), attr)
    return spec


def run_case(name, fn, make_args, specs, time_ms, dev) -> dict:
    args = make_args()
    ref = fn(*args)
    row = {"case": name, "bytes": nbytes(args, ref)}
    for spec in specs:
        torch._dynamo.reset()
        ember.metrics.reset()
        be = resolve(spec)
        f = fn if be is None else torch.compile(fn, backend=be)
        try:
            t0 = time.perf_counter()
            out = f(*args)
            if dev == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = time_ms(lambda: f(*args))
            r = {"ms": ms, "GBps": row["bytes"] / ms / 1e6, "first_call_s": first}
            if dev == "cuda":
                r["device_ms"] = device_ms(lambda: f(*args))
            bad = mismatch(out, ref)
            if bad:
                r["wrong"] = bad
            if spec == "ember":
                r["kernels"] = ember.metrics.generated_kernel_count
                r["fallbacks"] = dict(ember.metrics.fallbacks)
                r["eager_fallbacks"] = ember.metrics.eager_fallbacks
            row[spec] = r
        except Exception as e:  # one backend failing a case must not stop the others
            row[spec] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return row


# -- reporting -----------------------------------------------------------------------------------------------

def table(res: dict, specs: list[str]) -> str:
    roof = res["copy_GBps"]
    head = f"{'case':24}{'MB':>9}" + "".join(f"{s[:16]:>28}" for s in specs)
    has_ratio = "ember" in specs and "inductor" in specs
    if has_ratio:
        head += f"{'ember/inductor':>16}"
    lines = [f"copy roofline: {roof:.0f} GB/s   (each cell: ms per call, GB/s, % of copy; "
             f"ember/inductor = time ratio, lower is better)", head]
    for row in res["cases"]:
        cells = []
        for s in specs:
            r = row[s]
            if "error" in r:
                cells.append(f"{'ERROR':>28}")
            else:
                mark = " WRONG" if "wrong" in r else ""
                gbps = f"{r['GBps']:8.1f}" if r["GBps"] >= 10 else f"{r['GBps']:8.4f}"   # CPU smoke sizes are tiny
                cells.append(f"{r['ms']:9.3f} {gbps} {100 * r['GBps'] / roof:5.0f}%{mark}".rjust(28))
        line = f"{row['case']:24}{row['bytes'] / 1e6:9.1f}" + "".join(cells)
        if has_ratio:
            e, i = row["ember"], row["inductor"]
            line += f"{e['ms'] / i['ms']:16.2f}" if "ms" in e and "ms" in i else f"{'-':>16}"
        lines.append(line)
    if any("device_ms" in row[s] for row in res["cases"] for s in specs):
        lines += ["", "GPU kernel time only (profiler, host work left out): ms per call, % of copy"]
        for row in res["cases"]:
            cells = [f"{r['device_ms']:9.3f} {100 * row['bytes'] / r['device_ms'] / 1e6 / roof:5.0f}%".rjust(28)
                     if r.get("device_ms") else f"{'-':>28}" for r in (row[s] for s in specs)]
            lines.append(f"{row['case']:24}{row['bytes'] / 1e6:9.1f}" + "".join(cells))
    notes = []
    for row in res["cases"]:
        for s in specs:
            r = row[s]
            if "error" in r:
                notes.append(f"  {row['case']} / {s}: {r['error']}")
            elif "wrong" in r:
                notes.append(f"  {row['case']} / {s}: WRONG RESULT: {r['wrong']}")
            if s == "ember" and "kernels" in r:
                fb = ", ".join(f"{k} x{v}" for k, v in r["fallbacks"].items())
                notes.append(f"  {row['case']} / ember: {r['kernels']} kernel(s)" + (f", fallbacks: {fb}" if fb else "")
                             + (", RAN EAGERLY after an ember error" if r.get("eager_fallbacks") else ""))
    if notes:
        lines += ["", "notes:"] + notes
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="eager,inductor,ember")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="small sizes (a CPU smoke test)")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per backend (default 50 on GPU, 3 on CPU)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no GPU visible to torch; use --device cpu --small")
    specs = [s for s in a.backends.split(",") if s]
    if "eager" not in specs:
        specs.insert(0, "eager")   # the reference every other backend is checked against and compared with
    torch.manual_seed(0)
    time_ms = timer(a.device, a.iters or (50 if a.device == "cuda" else 3))
    import triton
    res = {"device": torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "small": a.small,
           "copy_GBps": copy_roofline(a.device, a.small, time_ms), "cases": []}
    print(f"{res['device']}  torch {res['torch']}  triton {res['triton']}  copy roofline {res['copy_GBps']:.0f} GB/s",
          flush=True)
    if a.device == "cpu" and "ember" in specs:
        print("note: on CPU ember's kernels run in the Triton interpreter: its CPU times are not a speed result")
    wanted = [w for w in a.cases.split(",") if w]
    for name, fn, make_args in cases(a.device, a.small):
        if wanted and not any(w in name for w in wanted):
            continue
        row = run_case(name, fn, make_args, specs, time_ms, a.device)
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    print()
    print(table(res, specs))
    failed = any("error" in row[s] or "wrong" in row[s] for row in res["cases"] for s in specs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
