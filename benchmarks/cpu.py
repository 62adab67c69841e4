"""CPU: eager vs torch.compile (inductor) vs ember (C++/OpenMP kernels), one process, checked against eager.

    python -m benchmarks.cpu [--threads 2] [--rounds 7] [--iters 10] [--cases softmax,gpt] [--no-cold]

Each timed round calls every backend `--iters` times in turn (backends interleaved, so load from other
jobs hits all of them alike); a cell is the median over rounds of the per-call mean, in ms. Cold compile
time of the GPT block: the first call of a fresh subprocess with each compiler's on-disk cache disabled
or pointed at an empty temporary directory (Dynamo + AOTAutograd + the backend + the C++ build).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import ember  # noqa: F401  (registers the backend)
from benchmarks.kernels import tensors

f32 = torch.float32


def rmsnorm_residual(x, r, w):
    h = x + r
    return h, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w


class Block(torch.nn.Module):
    """Pre-LN transformer block: attention written as plain matmuls + softmax, GELU MLP."""

    def __init__(self, d=256, heads=4):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (D // self.h) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def gpt_block():
    torch.manual_seed(0)
    m = Block().eval()
    return m, (torch.randn(8, 128, 256),)


TARGET = torch.randint(0, 1 << 30, (1 << 16,), generator=torch.Generator().manual_seed(0))


def grads_of(loss):
    """fn(*args) -> the gradients of loss(*args) with respect to every argument (a forward and a backward
    step; the benchmark otherwise runs under no_grad)."""
    def step(*args):
        with torch.enable_grad():
            args = [a.detach().requires_grad_() for a in args]
            return torch.autograd.grad(loss(*args), args)
    return step


def cases():
    M = N = 2048
    LM, LN = 4096, 1024

    def mk(*shape):
        return torch.randn(*shape, dtype=f32)

    yield "add_gelu", lambda x, b: F.gelu(x + b), lambda: (mk(M, N), mk(N))
    yield "softmax", lambda x: torch.softmax(x, -1), lambda: (mk(M, N),)
    yield "layernorm", lambda x, w, b: F.layer_norm(x, (LN,), w, b), lambda: (mk(LM, LN), mk(LN), mk(LN))
    yield "rmsnorm_residual", rmsnorm_residual, lambda: (mk(LM, LN), mk(LM, LN), mk(LN))
    yield "sum_rows", lambda x: x.sum(1), lambda: (mk(M, N),)
    yield "sum_cols", lambda x: x.sum(0), lambda: (mk(M, N),)
    yield "sum_all", lambda x: x.sum(), lambda: (mk(M, N),)
    yield "transpose_add", lambda x, y: x.t() + y, lambda: (mk(M, N), mk(N, M))
    # training steps of the memory-bound parts: forward and backward, the gradients returned
    yield "layernorm_fwd_bwd", grads_of(lambda x, w, b: F.layer_norm(x, (LN,), w, b).square().sum()), \
        lambda: (mk(LM, LN), mk(LN), mk(LN))
    yield "cross_entropy_fwd_bwd", grads_of(lambda x: F.cross_entropy(x, TARGET[: x.shape[0]] % x.shape[1])), \
        lambda: (mk(LN, 8192),)

    def gpt():
        m, args = gpt_block()
        return m, args
    yield "gpt_block", None, gpt



def mismatch(out, ref, tol=1e-4):
    outs, refs = tensors(out), tensors(ref)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, eager has {len(refs)}"
    for i, (a, e) in enumerate(zip(outs, refs)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
        atol = tol * max(1.0, e.abs().max().item())
        if not torch.allclose(a, e, rtol=tol, atol=atol, equal_nan=True):
            return f"output {i}: max abs error {(a - e).abs().max().item():.3g} (atol {atol:.3g})"
    return None


def bench_case(name, fn, make_args, backends, rounds, iters):
    if fn is None:                       # a module case: make_args gives (module, args)
        fn, args = make_args()
    else:
        args = make_args()
    with torch.no_grad():
        ref = fn(*args)
        fns, row = {}, {"case": name}
        for be in backends:
            torch._dynamo.reset()
            f = fn if be == "eager" else torch.compile(fn, backend=be)
            try:
                t0 = time.perf_counter()
                out = f(*args)
                row[be] = {"first_s": time.perf_counter() - t0}
                bad = mismatch(out, ref)
                if bad:
                    row[be]["wrong"] = bad
                f(*args)                 # warm-up
                fns[be] = f
            except Exception as e:       # one backend failing must not stop the others
                row[be] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        # interleave: every round times each backend once, so a burst of load hits them all
        times = {be: [] for be in fns}
        for _ in range(rounds):
            for be, f in fns.items():
                t = time.perf_counter()
                for _ in range(iters):
                    f(*args)
                times[be].append((time.perf_counter() - t) * 1e3 / iters)
        for be, ts in times.items():
            row[be]["ms"] = statistics.median(ts)
            row[be]["ms_all"] = [round(t, 4) for t in ts]
    return row


_COLD = r"""
import time, torch
torch.set_num_threads({threads})
import benchmarks.cpu as b
be = {backend!r}
if be == "inductor":
    import torch._inductor.config as ic
    ic.fx_graph_cache = False
    ic.autotune_local_cache = False
m, args = b.gpt_block()
torch._dynamo.reset()
f = torch.compile(m, backend=be)
with torch.no_grad():
    t = time.perf_counter()
    out = f(*args)
    cold = time.perf_counter() - t
    ref = m(*args)
print("COLD", cold, b.mismatch(out, ref))
"""


def cold_compile(backend: str, threads: int) -> dict:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                   EMBER_CACHE_DIR=os.path.join(d, "ember"), TRITON_CACHE_DIR=os.path.join(d, "triton"))
        env.pop("EMBER_DEBUG", None)
        # `python -c` imports from its working directory first: benchmarks/ and ember from this checkout
        r = subprocess.run([sys.executable, "-c", _COLD.format(threads=threads, backend=backend)], cwd=root,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    for line in r.stdout.splitlines():
        if line.startswith("COLD "):
            _, s, bad = line.split(" ", 2)
            return {"cold_s": float(s), "wrong": None if bad == "None" else bad}
    return {"error": (r.stderr or r.stdout)[-500:]}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--backends", default="eager,inductor,ember")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-compile measurement")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    backends = [b for b in a.backends.split(",") if b]
    if "eager" not in backends:
        backends.insert(0, "eager")
    wanted = [w for w in a.cases.split(",") if w]
    print(f"{cpu_model()}, nproc {os.cpu_count()}, torch threads {a.threads}, torch {torch.__version__}", flush=True)
    rows = []
    for name, fn, make_args in cases():
        if wanted and not any(w in name for w in wanted):
            continue
        row = bench_case(name, fn, make_args, backends, a.rounds, a.iters)
        rows.append(row)
        print(json.dumps(row), flush=True)
    cold = {}
    if not a.no_cold:
        for be in backends:
            if be != "eager":
                cold[be] = cold_compile(be, a.threads)
                print(f"cold compile {be}: {cold[be]}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "cold": cold}, f, indent=1)

    ratio = "ember" in backends and "inductor" in backends
    print()
    print(f"ms per call (median of {a.rounds} rounds x {a.iters} calls), {a.threads} threads; "
          f"ember/inductor = time ratio, lower is better")
    print(f"{'case':22}" + "".join(f"{b:>12}" for b in backends) + (f"{'ember/ind':>11}" if ratio else ""))
    failed = False
    for row in rows:
        cells = []
        for b in backends:
            r = row[b]
            if "ms" not in r:
                cells.append(f"{'ERROR':>12}")
                failed = True
            else:
                failed |= "wrong" in r
                cells.append(f"{r['ms']:11.3f}" + ("!" if "wrong" in r else " "))
        line = f"{row['case']:22}" + "".join(cells)
        if ratio:
            e, i = row["ember"], row["inductor"]
            line += f"{e['ms'] / i['ms']:11.2f}" if "ms" in e and "ms" in i else f"{'-':>11}"
        print(line)
    for row in rows:
        for b in backends:
            if "error" in row[b] or "wrong" in row[b]:
                print(f"  {row['case']} / {b}: {row[b].get('error') or 'WRONG: ' + row[b]['wrong']}")
    if cold:
        print("cold compile of gpt_block (fresh process, empty caches), first call: " +
              ", ".join(f"{b} {c['cold_s']:.2f} s" if "cold_s" in c else f"{b} ERROR {c['error']}"
                        for b, c in cold.items()))
        failed |= any("error" in c or c.get("wrong") for c in cold.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
