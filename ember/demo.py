"""`ember demo`: eager PyTorch, inductor and ember side by side on one small GPT, on the device at hand.

For each backend: the first call (Dynamo + AOTAutograd + the backend's compile + the first run), the
median time of a warm step, the most memory a step holds at once, how many kernels it runs, and its
largest error against eager. The exit code says whether ember's results were right.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import re
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from .device import backend_for


# -- the model -----------------------------------------------------------------------------------------------
# Written out by hand (no nn.MultiheadAttention, no SDPA) so that everything it does goes through ember's
# own lowerings: the softmax, layer norms and GELU become generated kernels; only the matmuls fall back.

class Block(nn.Module):
    def __init__(self, d: int, n_head: int, seq: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, n_head, seq) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.tok.weight)      # LM head tied to the token embedding


class Loss(nn.Module):
    """The model and its cross-entropy, so that a training step compiles the loss with the model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx, target):
        return F.cross_entropy(self.model(idx).flatten(0, 1).float(), target.flatten())


# "tiny" runs ember's kernels in the Triton interpreter in seconds; "cpu" keeps the whole demo (inductor's
# C++ build included) within a minute on two cores; on "cuda" the attention scores (8 x 16 x 512 x 512 per
# layer) and the 4096 x 4096 MLP activations make memory traffic, not kernel launches, what is measured.
SIZES = {
    "tiny": dict(vocab=256, d=64, n_layer=2, n_head=4, seq=32, batch=2, dtype=torch.float32),
    "cpu": dict(vocab=2048, d=256, n_layer=4, n_head=4, seq=128, batch=4, dtype=torch.float32),
    "cuda": dict(vocab=8192, d=1024, n_layer=4, n_head=16, seq=512, batch=8, dtype=torch.bfloat16),
}
# Largest error of a result relative to the largest magnitude of eager's: a whole network of bf16 roundings
# taken in a different order drifts by a few ulps of bf16 (2^-8), float32 by far less.
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
BACKENDS = ("eager", "inductor", "ember")
_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}

HELP = """\
columns:
  first call  Dynamo + AOTAutograd + the backend's compile + the first run, with empty kernel caches
              (unless --use-caches). One-time setup that is cached per machine (inductor's vector-ISA
              probe, in inductor's own cache folder, so only a machine's first demo waits for it; ember's
              C++ flags probe and precompiled header; Triton's driver helpers) and Dynamo's first compile
              in the process run before it; their times are printed below the table.
  step        the median of warm steps, the backends taking turns (synchronized on a GPU)
  step peak   the most memory a step holds at once beyond what was allocated before it. GPU:
              torch.cuda.max_memory_allocated. CPU: the running sum of the allocations and frees that
              torch.profiler records from the CPU allocator, so memory that C++ kernels take for themselves
              (stack, per-thread scratch) is not counted, for inductor and ember alike; n/a when the
              profiler records nothing
  kernels     kernel launches per step, matmuls left out (they are library calls in every row): ember's
              generated kernels, the kernel calls in inductor's output code, eager's ATen ops (views left out)
  max err     the largest |result - eager| over the output (training: the loss and every gradient),
              relative to eager's largest magnitude there
exit code: 0 when ember's results are within the tolerance, 1 when not or when ember failed, 2 on bad
arguments. Another backend's failure prints its row as "failed: <reason>" and does not change the code."""


def interpreted(device: str) -> bool:
    """Whether ember's kernels run in the Triton interpreter (slow: correctness, not speed)."""
    return backend_for(device).interpreted


@dataclasses.dataclass
class Row:
    name: str
    setup: str = ""                    # the backend's one-time setup (not in compile_s)
    setup_s: float | None = None
    compile_s: float | None = None     # first call of the model
    step_ms: float | None = None
    peak_bytes: int | None = None
    kernels: str = "-"
    err: float | None = None           # None: the reference itself
    ok: bool = True
    failed: str = ""                   # why the backend did not run
    detail: str = ""


class Workload:
    """The model, its inputs, and one step: an inference call, or forward, loss and backward."""

    def __init__(self, size: dict, device: str, train: bool):
        size = dict(size)
        batch, self.dtype = size.pop("batch"), size.pop("dtype")
        self.size, self.batch, self.device, self.train = size, batch, device, train
        torch.manual_seed(0)
        model = TinyGPT(**size).to(device=device, dtype=self.dtype).train(train)
        self.params = list(model.parameters())
        self.module = Loss(model) if train else model
        self.idx = torch.randint(0, size["vocab"], (batch, size["seq"]), device=device)
        self.target = torch.randint(0, size["vocab"], (batch, size["seq"]), device=device)

    def describe(self) -> str:
        s = self.size
        n = sum(p.numel() for p in self.params)
        what = "training step (forward, cross-entropy, backward)" if self.train else "inference"
        return (f"GPT with {s['n_layer']} layers, d={s['d']}, {s['n_head']} heads, seq {s['seq']}, batch {self.batch}, "
                f"vocab {s['vocab']} ({n / 1e6:.2f}M params, {str(self.dtype).replace('torch.', '')}), {what}")

    def clear_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self, fn) -> list[torch.Tensor]:
        """One step through fn (the module or a compiled one); its results: the logits, or the loss and
        every gradient."""
        if not self.train:
            with torch.no_grad():
                return [fn(self.idx)]
        self.clear_grads()
        loss = fn(self.idx, self.target)
        loss.backward()
        return [loss.detach()] + [p.grad for p in self.params]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time_ms(step, device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    step()
    return (time.perf_counter() - t) * 1e3


def _median_ms(step_of: dict, device: str, steps: int) -> dict:
    """name -> median milliseconds of a warm step, or the exception a step raised. The backends take turns,
    one step each, so that a change in what else runs on the machine reaches all of them alike."""
    times: dict = {name: [] for name in step_of}
    failed: dict = {}
    for _ in range(1 + steps):                  # a warm-up round (the first call and the peak step ran before)
        for name, step in step_of.items():
            if name not in failed:
                try:
                    times[name].append(_time_ms(step, device))
                except Exception as e:
                    failed[name] = e
    return {name: failed.get(name) or statistics.median(t[1:]) for name, t in times.items()}


def _allocation_sizes(event, out: list) -> None:
    from torch._C._profiler import _EventType
    if event.tag == _EventType.Allocation:
        out.append((event.start_time_ns, event.extra_fields.alloc_size))
    for child in event.children:
        _allocation_sizes(child, out)


def _step_peak_bytes(step, device: str) -> int | None:
    """The most bytes a step holds at once beyond what was allocated before it; None if unmeasurable."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    # the CPU allocator reports each allocation (+size) and free (-size) to the profiler: the running sum
    # in time order is what the step holds
    from torch.profiler import ProfilerActivity, profile
    saved = os.environ.get("KINETO_LOG_LEVEL")
    os.environ["KINETO_LOG_LEVEL"] = saved or "6"     # above every level kineto logs at: no lines on stderr
    try:
        with warnings.catch_warnings():     # some versions warn that a profile without a schedule keeps one cycle
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
        sizes: list = []
        for root in prof.profiler.kineto_results.experimental_event_tree():
            _allocation_sizes(root, sizes)
    except Exception:       # a profiler without the event tree: say n/a rather than guess
        return None
    finally:
        if saved is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)
    if not sizes:
        return None
    held = peak = 0
    for _, n in sorted(sizes):
        held += n
        peak = max(peak, held)
    return peak


class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops eager runs, leaving out views (no kernel) and matmuls (library calls)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in _MATMULS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _max_rel_err(results: list, reference: list) -> float:
    worst = 0.0
    for got, want in zip(results, reference, strict=True):
        if got is None or got.shape != want.shape or got.dtype != want.dtype or not bool(torch.isfinite(got).all()):
            return math.inf
        scale = want.float().abs().max().item()
        err = (got.float() - want.float()).abs().max().item()
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


def _reason(e: BaseException) -> str:
    # Dynamo wraps a backend's error, and its own message names only the backend
    while (inner := e.__cause__ or getattr(e, "inner_exception", None)) is not None:
        e = inner
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 110 else text[:107] + "..."


def _backend(name: str):
    import ember
    return ember.backend if name == "ember" else name


def _inductor_launches(sources: list) -> int:
    """Kernel launches in the `call` functions of inductor's output code (C++ kernels are called by name,
    Triton kernels through .run). Its generated_kernel_count counts the C++ backend's loop nests, several
    per kernel, so it is not a kernel count there."""
    return sum(len(re.findall(r"^\s+(?:cpp_fused_\w+|triton_\w+\.run)\(", src, re.M)) for src in sources)


def _first_call(name: str, fn, work: Workload) -> tuple[list, str]:
    """(results, kernels launched per step) of the call that compiles fn."""
    if name == "ember":
        import ember
        ember.metrics.reset()
        results = work.step(fn)
        return results, str(ember.metrics.generated_kernel_count)
    if name == "inductor":
        from unittest import mock

        from torch._inductor.graph import GraphLowering
        sources: list = []
        with mock.patch.object(GraphLowering, "save_output_code", sources.append):
            results = work.step(fn)
        return results, str(_inductor_launches(sources)) if sources else "-"
    return work.step(fn), "-"


def _ember_detail() -> str:
    import ember
    m = ember.metrics
    calls = ", ".join(f"{k.replace('aten.', '').replace('.default', '')} x{v}" for k, v in sorted(m.fallbacks.items()))
    return (f"{m.graphs_compiled} graph{'s' if m.graphs_compiled != 1 else ''}, "
            f"{m.generated_kernel_count} generated kernels, ATen calls: {calls or 'none'}")


def _toolchain_setup(name: str, device: str, caches: CacheDirs) -> str:
    """Runs the backend's one-time setup, which is cached on disk per machine, so that the model's first
    call measures compiling the model; returns what the setup was ('' for none)."""
    if name == "inductor" and device == "cpu":
        from torch._inductor.cpu_vec_isa import pick_vec_isa
        with caches.users():
            pick_vec_isa()      # builds and runs a probe program per vector instruction set
        return "vector-ISA probe"
    if name == "ember" and device == "cpu" and not interpreted(device):
        from .codegen.cpp import build
        build.build(build.PRELUDE)
        return "C++ flags probe, precompiled header"
    return ""


def _shared_setup(device: str) -> float:
    """Seconds of what every compiled backend needs once per process, or per machine: Dynamo's first
    compile, and on a GPU Triton's driver helpers (built into Triton's cache)."""
    t = time.perf_counter()
    torch.compile(lambda a: a + 1, backend="eager")(torch.randn(8, device=device))
    torch._dynamo.reset()
    if device == "cuda":
        from triton.runtime.driver import driver
        driver.active.utils  # noqa: B018  (built on first access)
    return time.perf_counter() - t


def prepare(name: str, work: Workload, reference: list, caches: CacheDirs) -> tuple[Row, object]:
    """One backend's row, less its times, and its step (None if the backend failed: an error in any
    backend fills `failed` instead of stopping the demo)."""
    row, device = Row(name), work.device
    try:
        if name == "eager":
            fn = work.module
            counter = _OpCounter()
            with counter:
                work.step(fn)
            row.kernels = f"{counter.count} ops"
        else:
            t = time.perf_counter()
            row.setup = _toolchain_setup(name, device, caches)
            row.setup_s = time.perf_counter() - t
            # no torch._dynamo.reset() between backends: each compiled module keeps its own entry in
            # Dynamo's cache (entries are guarded by their backend) for the timed steps after all compiles
            fn = torch.compile(work.module, backend=_backend(name))
            t = time.perf_counter()
            results, row.kernels = _first_call(name, fn, work)
            _sync(device)
            row.compile_s = time.perf_counter() - t
            if name == "ember":
                row.detail = _ember_detail()
            row.err = _max_rel_err(results, reference)
            row.ok = row.err <= REL_TOL.get(work.dtype, 1e-4)
        work.clear_grads()
        row.peak_bytes = _step_peak_bytes(lambda: work.step(fn), device)
    except Exception as e:
        row.failed, row.ok = _reason(e), False
        return row, None
    return row, lambda: work.step(fn)


def _set_env(values: dict) -> None:
    for n, v in values.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v


class CacheDirs:
    """ember's, inductor's and Triton's on-disk cache folders (their environment variables). `fresh()`
    points them at an empty folder, so that a first call compiles rather than hits a cache on every run
    of the demo; `users()` puts the user's own back for a while, for one-time setup whose result is worth
    keeping (inductor's vector-ISA probe, which it also remembers in the process)."""

    NAMES = ("EMBER_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

    def __init__(self, use_caches: bool):
        self.use_caches = use_caches
        self.saved = {n: os.environ.get(n) for n in self.NAMES}

    @contextlib.contextmanager
    def fresh(self):
        if self.use_caches:
            yield
            return
        with tempfile.TemporaryDirectory(prefix="ember_demo_caches_") as root:
            _set_env({n: os.path.join(root, n.split("_")[0].lower()) for n in self.NAMES})
            try:
                yield
            finally:
                _set_env(self.saved)            # inductor writes its folder back into the environment

    @contextlib.contextmanager
    def users(self):
        inside = {n: os.environ.get(n) for n in self.NAMES}
        _set_env(self.saved)
        try:
            yield
        finally:
            _set_env(inside)


def _kernels_in(path: str) -> list[str]:
    with open(path) as f:
        src = f.read()
    marker = "@triton.jit" if path.endswith(".py") else 'extern "C"'
    parts = src.split(marker)
    return [(marker + p).strip() for p in parts[1:]] or ([src.strip()] if src.strip() else [])


def _largest_kernel(debug_dir: str) -> tuple[str, str]:
    """(graph folder, source) of the longest kernel any compiled graph generated."""
    best = ("", "")
    for path in sorted(glob.glob(os.path.join(debug_dir, "graph_*", "kernels.*"))):
        for k in _kernels_in(path):
            if len(k) > len(best[1]):
                best = (os.path.basename(os.path.dirname(path)), k)
    return best


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"     # the Triton interpreter is hundreds of times slower


def _fmt_mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MB"


def table(rows: list[Row], steps: int, dtype: torch.dtype) -> str:
    eager_ms = next((r.step_ms for r in rows if r.name == "eager" and r.step_ms), None)
    head = ("backend", "first call", f"step (median of {steps})", "vs eager", "step peak", "kernels", "max err",
            "check")
    lines = []
    for r in rows:
        if r.failed:
            lines.append((r.name, f"failed: {r.failed}"))
            continue
        lines.append((r.name,
                      "-" if r.compile_s is None else f"{r.compile_s:.1f} s",
                      f"{r.step_ms:.2f} ms",
                      _fmt_ratio(eager_ms / r.step_ms) if eager_ms else "-",
                      _fmt_mb(r.peak_bytes),
                      r.kernels,
                      "-" if r.err is None else f"{r.err:.1e}",
                      "reference" if r.err is None else ("PASS" if r.ok else "FAIL")))
    widths = [max(len(head[i]), *(len(ln[i]) for ln in lines if i < len(ln) and (i == 0 or len(ln) == len(head))))
              for i in range(len(head))]

    def fmt(cells):
        if len(cells) != len(head):
            return f"{cells[0]:<{widths[0]}}  {cells[1]}"
        return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt(head)] + [fmt(ln) for ln in lines]
    out.append(f"(tolerance on max err for {str(dtype).replace('torch.', '')}: {REL_TOL.get(dtype, 1e-4):g}; "
               "vs eager: eager's step time / this one's, higher is faster)")
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    by = {r.name: r for r in rows if not r.failed}
    ember_row = next(r for r in rows if r.name == "ember")
    if ember_row.failed:
        return f"ember: failed ({ember_row.failed})"
    parts = [f"{_fmt_ratio(by[n].step_ms / ember_row.step_ms)} {n}" for n in ("eager", "inductor") if n in by]
    text = f"ember: {', '.join(parts)} (speed, higher is faster)" if parts else "ember"
    text += f"; first call {ember_row.compile_s:.1f} s"
    if "inductor" in by:
        text += f" vs inductor {by['inductor'].compile_s:.1f} s"
    if not ember_row.ok:
        text += f"; results WRONG (max err {ember_row.err:.2g})"
    return text


def run(device: str | None = None, backends: tuple = BACKENDS, steps: int | None = None, train: bool = False,
        size: str | None = None, use_caches: bool = False, show_kernel: bool = False) -> int:
    """The demo; returns the exit code: 0 when ember's results match eager's, 1 when not, 2 on bad arguments."""
    import ember

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("ember demo: --device cuda asked for, but torch sees no GPU", file=sys.stderr)
        return 2
    if "ember" not in backends or not all(backends) or len(set(backends)) != len(backends):
        print("ember demo: --backends is a comma-separated list that includes ember", file=sys.stderr)
        return 2
    size = size or ("tiny" if interpreted(device) else device)
    steps = steps or (3 if interpreted(device) else 20 if device == "cuda" else 10)
    work = Workload(SIZES[size], device, train)
    where = f"{device} ({torch.get_num_threads()} threads)" if device == "cpu" else torch.cuda.get_device_name()
    print(f"ember demo: {work.describe()} on {where}")
    if interpreted(device):
        print("  note: with cpu_backend='triton' ember runs its Triton kernels in the Triton interpreter, which is\n"
              "  very slow: ember's times show that the pipeline runs, not how fast it is.")
    if device == "cpu" and hasattr(os, "getloadavg") and os.getloadavg()[0] > (os.cpu_count() or 1):
        print(f"  note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: other processes share "
              "the CPU, so times are noisy")

    reference = [t.detach().clone() for t in work.step(work.module)]
    rows = []
    caches = CacheDirs(use_caches)
    with tempfile.TemporaryDirectory(prefix="ember_demo_") as dbg, caches.fresh(), \
            ember.config.patch(fallback_on_error=False, debug=show_kernel, debug_dir=dbg):
        shared_s = _shared_setup(device)
        step_of = {}
        for name in backends:
            row, step = prepare(name, work, reference, caches)
            rows.append(row)
            if step is not None:
                step_of[name] = step
        kgraph, ksrc = _largest_kernel(dbg) if show_kernel else ("", "")
        for name, ms in _median_ms(step_of, device, steps).items():
            row = next(r for r in rows if r.name == name)
            if isinstance(ms, Exception):
                row.failed, row.ok = _reason(ms), False
            else:
                row.step_ms = ms

    print()
    print(table(rows, steps, work.dtype))
    setups = [f"Dynamo's first compile{' and Triton driver' if device == 'cuda' else ''} {shared_s:.1f} s"]
    setups += [f"{r.name} {r.setup_s:.1f} s ({r.setup})" for r in rows if r.setup]
    print(f"one-time setup, not in 'first call': {', '.join(setups)}")
    for r in rows:
        if r.detail:
            print(f"{r.name}: {r.detail}")
    if ksrc:
        print(f"\nlargest kernel ember generated ({kgraph}, {len(ksrc.splitlines())} lines):\n\n{ksrc}")
    print()
    print(summary(rows))
    ember_row = next(r for r in rows if r.name == "ember")
    return 0 if ember_row.ok and not ember_row.failed else 1
