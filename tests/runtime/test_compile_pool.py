"""The compile pool on a CPU: its workers compile real Triton kernels for a GPU target (no GPU needed to
compile) into Triton's on-disk cache, one binary per launch config, and a job that fails comes back as
text without stopping the others. (On a GPU, `scripts/compile_time.py` checks that the first launches
then load these binaries: the graph's first call gets faster.)"""
import hashlib
import os

import pytest
import torch

import ember
from ember.codegen.triton.backend import triton_helpers
from ember.runtime import compile_pool, loader

SOURCE = "import triton\nimport triton.language as tl\n" + '''
@triton.jit
def scale(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_ptr0 + xindex, xmask).to(tl.float32)
    tl.store(out_ptr0 + xindex, helpers.prod(x, 3.0), xmask)
'''


@pytest.fixture
def pool(tmp_path, monkeypatch):
    pytest.importorskip("triton.backends.nvidia")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))     # the workers inherit it
    p = compile_pool.CompilePool(2)
    yield p
    p.close()


def _job(mod, kernel, cfg):
    return {"path": mod.__file__, "helpers": triton_helpers().__file__, "kernel": kernel,
            "target": ("cuda", 90, 32), "args": [torch.bfloat16, torch.float32, 4096], "configs": [cfg]}


def test_workers_fill_tritons_cache_one_binary_per_config(pool, tmp_path):
    mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
    cfgs = [{"XBLOCK": 256, "num_warps": 4}, {"XBLOCK": 1024, "num_warps": 8}]
    assert pool.run([_job(mod, "scale", c) for c in cfgs]) == []
    cubins = [f for _, _, files in os.walk(tmp_path / "triton") for f in files if f.endswith(".cubin")]
    assert len(cubins) == 2


def test_workers_say_what_launching_each_binary_takes(pool, tmp_path):
    """Each answer names the binary's file in Triton's cache, its function, warps and shared memory, and the
    call's arguments its function takes (both pointers and the size, as an i32) with their C type codes."""
    from ember.runtime import static_launch
    mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
    cfgs = [{"XBLOCK": 256, "num_warps": 4}, {"XBLOCK": 1024, "num_warps": 8}]
    facts = []
    jobs = [dict(_job(mod, "scale", c), static_launch=static_launch.__file__) for c in cfgs]
    assert pool.run(jobs, facts) == []
    for cfg, (f,) in zip(cfgs, facts):
        assert f["binary"].startswith(str(tmp_path / "triton")) and f["binary"].endswith(".cubin")
        assert os.path.exists(f["binary"])
        assert f["sha256"] == hashlib.sha256(open(f["binary"], "rb").read()).hexdigest()
        assert f["name"] == "scale" and f["warps"] == cfg["num_warps"] and f["shared"] >= 0
        assert f["keep"] == [0, 1, 2] and f["codes"] == "OOi" + "O" * f["n_scratch"]


def test_a_worker_builds_the_row_copy_which_calls_no_helpers(pool):
    """runtime/row_copy.py's kernel is no graph's: a job with no helpers module builds it, and says how
    torch's C launcher launches it (ember::padded_mm's first run then needs no JIT)."""
    from ember.runtime import row_copy, static_launch
    args = [torch.bfloat16, torch.bfloat16, 50257, 50264, 50257]
    job = {"path": row_copy._module().__file__, "helpers": None, "kernel": "copy_rows", "target": ("cuda", 90, 32),
           "args": args, "configs": [dict(row_copy._META)], "static_launch": static_launch.__file__}
    facts = []
    assert pool.run([job], facts) == []
    assert facts[0][0]["name"] == "copy_rows" and facts[0][0]["warps"] == row_copy._META["num_warps"]


def test_the_row_copy_is_built_ahead_once_per_shape(monkeypatch):
    """compile_ahead sends one job per (dtype, row length, strides) to the workers, even alone, and the
    launcher it keeps is built for exactly those arguments."""
    from ember.runtime import row_copy
    sent = []

    def precompile_ahead(module, helpers, kernels, min_jobs=2):
        sent.append((helpers, [(k.name, k.warm.args) for k in kernels], min_jobs))
        return compile_pool.PendingBinaries(type("Done", (), {"result": lambda self: {}})())
    monkeypatch.setattr(compile_pool, "precompile_ahead", precompile_ahead)
    monkeypatch.setattr(row_copy, "_launchers", {})
    monkeypatch.setattr(loader, "_triton_files", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)       # as on a GPU: a JITFunction to launch
    with ember.config.patch(fast_launch=True):
        for _ in range(2):
            row_copy.compile_ahead(torch.bfloat16, 50257, 50264, 50257)
    assert sent == [(None, [("copy_rows", [torch.bfloat16, torch.bfloat16, 50257, 50264, 50257])], 1)]
    launcher = row_copy._launchers[(torch.bfloat16, 50257, 50264, 50257)]
    assert launcher.built_for == [torch.bfloat16, torch.bfloat16, 50257, 50264, 50257]


def test_a_failing_job_is_reported_and_the_rest_still_compile(pool, tmp_path):
    mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
    errors = pool.run([_job(mod, "no_such_kernel", {"XBLOCK": 64}), _job(mod, "scale", {"XBLOCK": 128})])
    assert len(errors) == 1 and "no_such_kernel" in errors[0]
    assert not pool.broken
    cubins = [f for _, _, files in os.walk(tmp_path / "triton") for f in files if f.endswith(".cubin")]
    assert len(cubins) == 1


def test_warm_spec_of_a_generated_gpu_kernel_names_its_dtypes_and_sizes(monkeypatch):
    """What TritonBackend records for the pool: a dtype per pointer and the sizes the wrapper passes."""
    from ember.codegen.triton.backend import TritonBackend
    monkeypatch.setattr(compile_pool, "start", lambda: None)
    monkeypatch.setattr(ember.config, "autotune", False)
    backend = TritonBackend(interpret=False)
    captured = []
    orig = backend._warm
    monkeypatch.setattr(backend, "_warm", lambda *a: captured.append(orig(*a)) or captured[-1])
    import ember.codegen.program as program
    monkeypatch.setattr(program, "backend_for", lambda device: backend)
    from ember import compile_graph
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        return (x.float() * 2 + y).sum(1)
    x, y = torch.randn(8, 33).bfloat16(), torch.randn(8, 33)
    gm = make_fx(f)(x, y)
    compile_graph(gm, [x, y])          # generated and loaded, never called: nothing launches without a GPU
    assert captured, "no GPU kernel was generated"
    spec = captured[0]
    assert spec.args[:2] == [torch.bfloat16, torch.float32] and 8 in spec.args and 33 in spec.args
    assert spec.configs and all("XBLOCK" in c for c in spec.configs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launching needs a GPU")
def test_first_launch_loads_what_the_workers_compiled(tmp_path, monkeypatch):
    """The point of the pool: the wrapper's first launch finds the worker's binary under the key it
    computes itself, so it compiles nothing (Triton's cache gains no new entry)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from triton import knobs
    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "triton"), raising=False)
    pool = compile_pool.CompilePool(2)
    try:
        mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
        job = _job(mod, "scale", {"XBLOCK": 512, "num_warps": 4})
        job["target"] = compile_pool._target()
        assert pool.run([job]) == []
    finally:
        pool.close()
    entries = set(os.listdir(tmp_path / "triton"))
    x = torch.randn(4096, device="cuda").bfloat16()
    out = torch.empty(4096, device="cuda")
    mod.scale[(8,)](x, out, 4096, XBLOCK=512, num_warps=4)
    torch.testing.assert_close(out, x.float() * 3.0)
    # any new entry is a kernel compiled again (under another key) or a launcher the worker did not build
    assert set(os.listdir(tmp_path / "triton")) == entries, "the first launch compiled something itself"


def test_no_pool_when_workers_are_off(monkeypatch):
    import ember
    with ember.config.patch(compile_workers=0):
        assert compile_pool.start() is None
    with ember.config.patch(compile_workers=1):
        assert compile_pool.start() is None


def test_workers_failing_on_every_kernel_warn_once(monkeypatch, caplog):
    """A pool that compiles nothing must say so (kernels then compile one by one at first launch)."""
    import logging
    import types

    class Broken:
        broken = warned = False

        def run(self, jobs, facts=None):
            return ["RuntimeError: no GPU here"] * len(jobs)
    broken = Broken()
    monkeypatch.setattr(compile_pool, "start", lambda: broken)
    monkeypatch.setattr(compile_pool, "_target", lambda: ("cuda", 90, 32))
    mod = types.SimpleNamespace(__file__="k.py")
    kernels = [types.SimpleNamespace(name=f"k{i}", warm=compile_pool.WarmSpec([torch.float32, 8], [{"XBLOCK": 8}]))
               for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="ember"):
        compile_pool.precompile(mod, mod, kernels)
        compile_pool.precompile(mod, mod, kernels)
    warnings = [r for r in caplog.records if "compile workers failed" in r.getMessage()]
    assert len(warnings) == 1 and "no GPU here" in warnings[0].getMessage()


def test_a_warm_start_asks_no_workers(monkeypatch, tmp_path):
    """Jobs the pool compiled into the current Triton cache are not sent again from a later process (the
    same module, configs and cache): no workers start, and what the workers said of each binary comes back
    from the marker. Another Triton cache sends them again."""
    import types
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "ember"))
    triton_cache = tmp_path / "triton"
    triton_cache.mkdir()
    monkeypatch.setattr(compile_pool, "_triton_cache_dir", lambda: str(triton_cache))
    monkeypatch.setattr(compile_pool, "_target", lambda: ("cuda", 90, 32))
    runs = []

    class Pool:
        broken = warned = False

        def run(self, jobs, facts=None):
            runs.append(len(jobs))
            facts += [[{"binary": f"/cache/{j['kernel']}.cubin", "warps": 4}] for j in jobs]
            return []
    monkeypatch.setattr(compile_pool, "start", lambda: Pool())
    mod = types.SimpleNamespace(__file__="ember_kernels_0123.py")
    kernels = [types.SimpleNamespace(name=f"k{i}", warm=compile_pool.WarmSpec([torch.float32, 8], [{"XBLOCK": 8}]))
               for i in range(3)]
    cold = compile_pool.precompile(mod, mod, kernels)
    key = compile_pool.config_key({"XBLOCK": 8})
    assert cold == {f"k{i}": {key: {"binary": f"/cache/k{i}.cubin", "warps": 4}} for i in range(3)}
    monkeypatch.setattr(compile_pool, "start", lambda: pytest.fail("a warm start started the workers"))
    assert compile_pool.precompile(mod, mod, kernels) == cold
    assert runs == [3]
    other = tmp_path / "triton2"
    other.mkdir()
    monkeypatch.setattr(compile_pool, "_triton_cache_dir", lambda: str(other))
    monkeypatch.setattr(compile_pool, "start", lambda: Pool())
    compile_pool.precompile(mod, mod, kernels)
    assert runs == [3, 3]


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process `pid` has exited and been reaped within `within_s` seconds."""
    import time
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_worker_stuck_on_a_kernel_is_stopped_and_the_pool_set_aside(monkeypatch, tmp_path):
    """A worker that never answers must not hang the program: after JOB_TIMEOUT_S its job fails, the
    worker is killed and the pool is marked broken (launches then compile their kernels themselves)."""
    pytest.importorskip("triton.backends.compiler")
    stuck = tmp_path / "stuck_kernels.py"
    stuck.write_text("import time\ntime.sleep(60)\n")         # a kernel module whose import never ends
    monkeypatch.setattr(compile_pool, "JOB_TIMEOUT_S", 0.5)
    pool = compile_pool.CompilePool(2)
    try:
        job = {"path": str(stuck), "helpers": str(stuck), "target": ("cuda", 90, 32), "args": [], "configs": [{}]}
        errors = pool.run([dict(job, kernel="k0"), dict(job, kernel="k1")])
        assert len(errors) == 2 and all("longer than 0 s on one kernel" in e for e in errors), errors
        assert pool.broken
        assert all(w.pid is not None and _gone(w.pid) for w in pool.workers)     # killed, not left running
    finally:
        pool.close()


@pytest.mark.skipif(not compile_pool.forks_workers(), reason="workers are forked only where fork is")
def test_workers_are_forked_from_one_zygote():
    """The workers are children of one process that imported torch and Triton once; each answers as a
    process of its own; closing the pool ends them and the zygote."""
    pytest.importorskip("triton.backends.compiler")
    pool = compile_pool.CompilePool(3)
    try:
        zygote = pool.zygote.proc.pid
        # a job on a missing module answers with its error: every worker is up and answering
        errors = pool.run([{"path": "/nonexistent.py", "helpers": "/nonexistent.py", "kernel": "k",
                            "target": ("cuda", 90, 32), "args": [], "configs": [{}]}] * 3)
        assert len(errors) == 3 and all("nonexistent" in e for e in errors)
        pids = {w.pid for w in pool.workers if w.pid is not None}
        assert pids and zygote not in pids
        if os.path.exists(f"/proc/{zygote}"):
            for pid in pids:
                status = open(f"/proc/{pid}/status").read()
                assert f"PPid:\t{zygote}\n" in status
    finally:
        pool.close()
    assert pool.zygote.proc.wait(timeout=10) == 0
    assert all(_gone(pid) for pid in pids)


@pytest.mark.skipif(not compile_pool.forks_workers(), reason="workers are forked only where fork is")
def test_a_zygote_that_died_leaves_the_pool_set_aside():
    """If the zygote dies before it forks, the workers read as exited: their jobs fail at once (no hang)
    and the pool is set aside, so kernels compile at their first launch."""
    pool = compile_pool.CompilePool(2)
    try:
        pool.zygote.proc.kill()
        pool.zygote.proc.wait(timeout=10)
        errors = pool.run([{"kernel": "k0"}, {"kernel": "k1"}])
        assert len(errors) == 2 and all("exited" in e for e in errors), errors
        assert pool.broken
    finally:
        pool.close()


@pytest.mark.skipif(not compile_pool.forks_workers(), reason="workers are forked only where fork is")
def test_a_zygote_booted_ahead_that_died_sets_the_pool_aside():
    """A zygote booted at Dynamo's compile start that is gone when the pool starts (killed, out of memory):
    starting the pool raises nothing; the pool is set aside, so kernels compile at their first launch."""
    zygote = compile_pool._Zygote()
    zygote.proc.kill()
    zygote.proc.wait(timeout=10)
    zygote.requests.recv(1)             # the zygote's end is closed: its socket reads as ended
    pool = compile_pool.CompilePool(2, zygote)
    try:
        assert pool.broken and not pool.workers
    finally:
        pool.close()


@pytest.mark.skipif(not compile_pool.forks_workers(), reason="workers are forked only where fork is")
def test_the_pool_forks_from_the_zygote_booted_ahead(monkeypatch):
    """boot() starts the process's zygote once (Dynamo's compile start on a GPU machine); the pool started
    later forks its workers from that one."""
    monkeypatch.setattr(compile_pool, "_pool", [])
    monkeypatch.setattr(compile_pool, "_zygote", [])
    monkeypatch.setattr(compile_pool.atexit, "register", lambda fn: None)
    with ember.config.patch(compile_workers=2):
        compile_pool.boot()
        compile_pool.boot()
        assert len(compile_pool._zygote) == 1
        booted = compile_pool._zygote[0]
        pool = compile_pool.start()
    try:
        assert pool is not None and pool.zygote is booted and not compile_pool._zygote
        compile_pool.boot()                     # a pool is running: nothing more to boot
        assert not compile_pool._zygote
    finally:
        pool.close()


def test_triton_key_is_hashed_ahead_in_the_workers(monkeypatch):
    """Every Triton cache lookup needs Triton's key of its installation (a third of a second to hash): the
    zygote hashes it while it boots, so the workers forked from it start with it."""
    import importlib
    worker = importlib.import_module("ember.runtime.compile_worker")
    try:
        from triton.runtime.cache import triton_key as key
    except ImportError:
        pytest.skip("this Triton keeps no triton_key in triton.runtime.cache")
    if not hasattr(key, "cache_info"):
        pytest.skip("this Triton has no cached triton_key")
    key.cache_clear()
    worker._preload()
    assert key.cache_info().currsize == 1


def test_a_worker_builds_tritons_launcher_only_for_binaries_the_c_launcher_cannot_take(monkeypatch):
    """Triton versions that compile a C launcher per kernel signature take about half a second a job for it;
    a binary whose launch facts the worker returns launches through torch's C launcher, so none is built
    for it (the compile itself and the facts: test_workers_say_what_launching_each_binary_takes)."""
    import importlib
    import types
    worker_module = importlib.import_module("ember.runtime.compile_worker")
    built = []
    monkeypatch.setattr(worker_module, "build_launcher", built.append)
    worker = worker_module.Worker()
    kernels = types.SimpleNamespace(k=types.SimpleNamespace(warmup=lambda *args, grid, **meta: ("binary", meta)))
    monkeypatch.setattr(worker, "_aim", lambda target: None)
    monkeypatch.setattr(worker, "_module", lambda path, helpers: kernels)
    monkeypatch.setattr(worker, "_facts", lambda job, kernel: {"name": "k"} if job.get("static_launch") else None)
    job = {"path": "p", "helpers": "h", "kernel": "k", "target": ("cuda", 90, 32), "args": [4096],
           "configs": [{"XBLOCK": 64}, {"XBLOCK": 128}]}
    assert worker.compile(dict(job, static_launch="s")) == [{"name": "k"}] * 2 and built == []
    assert worker.compile(job) == [None, None]              # no facts asked for: Triton launches them
    assert built == [("binary", {"XBLOCK": 64}), ("binary", {"XBLOCK": 128})]


def test_a_call_the_binary_was_built_for():
    """The preloaded binary serves exactly the calls Triton's JIT would give it: pointers of the built
    dtypes, 16-byte aligned, and every other argument equal to the built value (of the same type)."""
    from ember.runtime.launch import _built_for
    x, y = torch.randn(64).bfloat16(), torch.randn(64)
    built = [torch.bfloat16, torch.float32, 4096]
    assert _built_for(built, (x, y, 4096))
    assert not _built_for(built, (x, y, 4095))              # another size: another specialization, maybe
    assert not _built_for(built, (x, y, True))              # a bool is no int
    assert not _built_for(built, (y, y, 4096))              # another dtype
    assert not _built_for(built, (x[1:], y, 4096))          # a pointer 2 bytes past alignment
    assert not _built_for(built, (x, y))
    assert not _built_for(None, (x, y, 4096))
    # a parameter Triton does not specialize (a layer's seed position): any value of the same width
    assert _built_for(built, (x, y, 17), unspecialized={2})
    assert not _built_for(built, (x, y, 2**40), unspecialized={2})


def test_a_first_call_launches_the_preloaded_binary_without_the_jit(monkeypatch):
    """A wrapper line's first call with the arguments a worker built the binary for goes straight to the
    binary (loaded by torch's C launcher, here a stand-in): no JIT launch; pointers go as integers. A call
    with other arguments goes through the JIT."""
    pytest.importorskip("triton")
    from ember.runtime import launch
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)      # a JITFunction, as on a GPU
    mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
    meta = {"XBLOCK": 512, "num_warps": 4}
    facts = {"binary": "/cache/scale.cubin", "name": "scale"}
    loads, launches, jit = [], [], []
    monkeypatch.setattr(launch, "_device_and_stream", lambda: (lambda: 0, lambda d: 7))
    monkeypatch.setattr(launch, "load_binary", lambda f, d, r: loads.append((f, d, r)) or
                        (lambda grid, stream, a: launches.append((grid, stream, a))))
    launcher = launch.Launcher(mod.scale, {compile_pool.config_key(meta): facts}, [torch.bfloat16, torch.float32, 4096])
    monkeypatch.setattr(launcher, "jit_launch", lambda *a: jit.append(a))
    monkeypatch.setattr(type(mod.scale), "__getitem__", lambda self, grid: lambda *a, **m: jit.append(a))
    sites = []
    site = launcher.site(meta, sites.append)
    x, out = torch.randn(4096).bfloat16(), torch.empty(4096)
    site((8,), x, out, 4096)
    assert loads == [(facts, 0, 1)] and jit == [] and ember.metrics.binaries_loaded == 1
    assert launches == [((8,), 7, (x.data_ptr(), out.data_ptr(), 4096))]
    sites[0]((8,), x, out, 4096)                # the same key: the same launch function, loaded once
    assert len(launches) == 2 and len(loads) == 1
    sites[0]((8,), x, out, 2048)                # another size: the JIT's
    assert len(jit) == 1 and len(loads) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launching needs a GPU")
def test_the_workers_binary_launches_without_the_jit(tmp_path, monkeypatch):
    """On a GPU: the binary a worker built, loaded from its file by torch's C launcher, computes what the
    kernel should, at the first call and the next, and Triton's JIT is never asked."""
    from ember.runtime import launch, static_launch
    if static_launch.c_launcher() is None:
        pytest.skip("this torch has no C launcher")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    pool = compile_pool.CompilePool(2)
    meta = {"XBLOCK": 512, "num_warps": 4}
    try:
        mod = loader.load_module(SOURCE, "ember_kernels_test", {"helpers": triton_helpers()})
        job = dict(_job(mod, "scale", meta), target=compile_pool._target(), static_launch=static_launch.__file__)
        facts = []
        assert pool.run([job], facts) == [] and facts[0][0] is not None
    finally:
        pool.close()
    launcher = launch.Launcher(mod.scale, {compile_pool.config_key(meta): facts[0][0]}, job["args"])
    monkeypatch.setattr(type(mod.scale), "__getitem__", lambda self, grid: pytest.fail("the JIT was asked"))
    sites = []
    site = launcher.site(meta, sites.append)
    for _ in range(2):
        x = torch.randn(4096, device="cuda").bfloat16()
        out = torch.empty(4096, device="cuda")
        (sites[0] if sites else site)((8,), x, out, 4096)
        torch.testing.assert_close(out, x.float() * 3.0)


def test_a_binary_is_loaded_once_per_device(monkeypatch, tmp_path):
    """Wrapper lines that launch the same binary share its function handle: one module load per device. A
    file that is not the one the worker built (its checksum differs) is never loaded."""
    import hashlib
    from ember.runtime import static_launch
    binary = tmp_path / "k.cubin"
    binary.write_bytes(b"\x7fELF a kernel")
    loads, launches = [], []

    class FakeLauncher:
        @staticmethod
        def _load_kernel(path, name, shared, device):
            loads.append((path, device))
            return (1000 + len(loads), 32, 0)

        @staticmethod
        def _launch_kernel(*args):
            launches.append(args)
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", FakeLauncher, raising=False)
    monkeypatch.setattr(static_launch, "_loaded", {})
    facts = {"binary": str(binary), "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(), "name": "k",
             "warps": 4, "shared": 0, "keep": [0, 2], "codes": "Oi", "n_scratch": 0}
    go = [static_launch.load_binary(facts, device, 1) for device in (0, 0, 1)]
    assert loads == [(str(binary), 0), (str(binary), 1)]
    go[1]((4,), 7, (123, 5, 64))
    assert launches == [(1001, 4, 1, 1, 4, 0, "Oi", (123, 64), 7)]
    binary.write_bytes(b"\x7fELF another kernel")
    with pytest.raises(ValueError, match="not the binary"):
        static_launch.load_binary(facts, 2, 1)
    assert len(loads) == 2


def test_a_damaged_marker_gives_no_binaries(tmp_path):
    """The marker's facts are read only when its checksum holds: truncated or altered, it gives none (the
    kernels then load through the JIT)."""
    path = str(tmp_path / "marker")
    facts = {"k0": {compile_pool.config_key({"XBLOCK": 8}): {"binary": "/cache/k0.cubin"}}}
    compile_pool._write_marker(path, facts)
    assert compile_pool._read_marker(path) == facts
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-3])
    assert compile_pool._read_marker(path) == {}
    open(path, "wb").write(data.replace(b"k0.cubin", b"k1.cubin"))
    assert compile_pool._read_marker(path) == {}


@pytest.fixture
def warmed(monkeypatch):
    """A machine with a GPU whose backend records its warm-ups: the list of them."""
    from ember import dynamo
    warmed = []

    class GPUBackend:
        def warm_up(self):
            warmed.append("cuda")
    monkeypatch.setattr(dynamo, "_has_gpu", lambda: True)
    monkeypatch.setattr(dynamo, "backend_for", lambda device: GPUBackend() if device == "cuda" else None)
    return warmed


def test_a_gpu_machine_boots_the_zygote_when_dynamo_starts(monkeypatch, warmed):
    """On a machine with a GPU, the GPU backend warms up (the compile workers' zygote boots) when Dynamo
    starts to compile, before the graph reaches any backend; the callback comes back after a reset."""
    from torch._dynamo.callback import callback_handler
    from ember import dynamo
    torch._dynamo.reset()
    assert dynamo._on_dynamo_compile_start not in callback_handler.start_callbacks
    dynamo._install_compile_callbacks()         # what ember's import and each graph reaching ember do
    dynamo._install_compile_callbacks()
    assert callback_handler.start_callbacks.count(dynamo._on_dynamo_compile_start) == 1

    def backend(gm, example_inputs):
        assert warmed == ["cuda"], "warmed up before the graph reached a backend"
        return gm
    monkeypatch.setattr(dynamo, "ember_backend", backend)      # this backend stands for ember's
    torch.compile(lambda x: x * 2, backend=backend)(torch.randn(3))
    assert warmed == ["cuda"]
    torch._dynamo.reset()


@pytest.mark.parametrize("cuda_in_use", [True, False])
def test_importing_ember_with_cuda_in_use_warms_the_gpu_backend_up(monkeypatch, warmed, cuda_in_use):
    """torch.compile looks ember up (imports it) before the first trace: where the process already uses
    its GPU the compile workers' zygote boots then; elsewhere (the command line, CPU programs) nothing starts."""
    from ember import dynamo
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda_in_use)
    dynamo.register()
    assert warmed == (["cuda"] if cuda_in_use else [])


@pytest.mark.parametrize("other", ["eager", "aot_eager"])
def test_a_compile_for_another_backend_boots_no_zygote(monkeypatch, warmed, other):
    """A process that imported ember but compiles a frame for another backend: Dynamo's start callback sees
    which backend the frame is for and leaves ember's compile workers unstarted; for ember, through
    torch.compile's wrappers (a mode, dynamic shapes), it warms up."""
    from ember import dynamo
    torch._dynamo.reset()
    dynamo._install_compile_callbacks()
    torch.compile(lambda x: x * 2, backend=other)(torch.randn(3))
    assert warmed == []
    assert dynamo._compiling_for_ember() is None           # outside a compile: unknown
    calls = []
    monkeypatch.setattr(dynamo, "_compiling_for_ember", lambda real=dynamo._compiling_for_ember: calls.append(real())
                        or calls[-1])
    torch.compile(lambda x: x * 3, backend="ember", mode="max-autotune-no-cudagraphs", dynamic=True)(torch.randn(3))
    assert calls[0] is True and warmed and warmed[0] == "cuda"
    torch._dynamo.reset()


def test_the_triton_backend_boots_the_zygote_in_warm_up(monkeypatch):
    """warm_up boots the zygote; the interpreter (which compiles nothing) does not."""
    from ember.codegen.triton.backend import TritonBackend
    booted = []
    monkeypatch.setattr(compile_pool, "boot", lambda: booted.append(1))
    TritonBackend(interpret=False).warm_up()
    TritonBackend(interpret=True).warm_up()
    assert booted == [1]


def _fake_kernels(n: int):
    import types
    mod = types.SimpleNamespace(__file__="ember_kernels_ahead.py")
    kernels = [types.SimpleNamespace(name=f"k{i}", warm=compile_pool.WarmSpec([torch.float32, 8], [{"XBLOCK": 8}]))
               for i in range(n)]
    return mod, kernels


def test_precompiling_ahead_returns_at_once_and_the_first_launch_waits(monkeypatch, tmp_path):
    """compile_pool.precompile_ahead (a training step's forward graph) returns while the workers still
    compile; the first launch that asks for a binary waits for all of them, and a failed precompile leaves
    every binary to its launch's own compile."""
    import threading
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "ember"))
    monkeypatch.setattr(compile_pool, "_triton_cache_dir", lambda: None)
    monkeypatch.setattr(compile_pool, "_target", lambda: ("cuda", 90, 32))
    started, release = threading.Event(), threading.Event()

    class Pool:
        broken = warned = False

        def run(self, jobs, facts=None):
            started.set()
            release.wait(10)
            facts += [[{"binary": f"/cache/{j['kernel']}.cubin"}] for j in jobs]
            return []
    monkeypatch.setattr(compile_pool, "start", lambda: Pool())
    mod, kernels = _fake_kernels(3)
    key = compile_pool.config_key({"XBLOCK": 8})
    pending = compile_pool.precompile_ahead(mod, mod, kernels)
    assert started.wait(5)                      # the jobs run, and the call has returned
    binaries, got = pending.get("k1"), []
    assert binaries                             # runtime/launch.Launcher keeps it as its binaries
    first_launch = threading.Thread(target=lambda: got.append(binaries.get(key)))
    first_launch.start()
    first_launch.join(0.3)
    assert first_launch.is_alive() and not got  # waiting for the workers
    release.set()
    first_launch.join(5)
    assert got == [{"binary": "/cache/k1.cubin"}]
    assert pending.get("k9").get(key) is None

    class Broken:
        broken = warned = False

        def run(self, jobs, facts=None):
            raise RuntimeError("the pool went away")
    monkeypatch.setattr(compile_pool, "start", lambda: Broken())
    assert compile_pool.precompile_ahead(mod, mod, kernels).get("k0").get(key) is None


def test_a_training_steps_kernels_are_waited_for_at_their_first_launch(monkeypatch):
    """A training step's forward and backward graphs are loaded with compile_pool.waits_at_first_launch() set
    (AOTAutograd compiles the backward while the workers compile the forward's kernels, and the forward's
    first run goes on while they compile the backward's); an inference graph waits for its kernels inside
    its compile."""
    from ember.codegen.triton import backend
    from ember.testing import check
    seen, load = [], backend.TritonBackend.load

    def recorded(self, kernels):
        seen.append(compile_pool.waits_at_first_launch())
        return load(self, kernels)
    monkeypatch.setattr(backend.TritonBackend, "load", recorded)
    x = torch.randn(64, 32)
    with ember.config.patch(cpu_backend="triton", graph_cache=False):
        check(lambda x: (x.sin() * x.cos()).sum(1), x, grad=True)
        assert seen == [True, True], seen
        seen.clear()
        with torch.no_grad():
            check(lambda x: (x.sin() * x.cos()).sum(1), x)
    assert seen == [False], seen
    assert not compile_pool.waits_at_first_launch()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launching needs a GPU")
def test_the_row_copy_launches_the_workers_binary(tmp_path, monkeypatch):
    """ember::padded_mm's row copy, built ahead by the workers, copies misaligned rows exactly and its first
    call loads the workers' binary instead of compiling through Triton's JIT."""
    from ember.runtime import row_copy
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(row_copy, "_launchers", {})
    src = torch.randn(300, 1008, device="cuda").bfloat16()
    dst = torch.empty(300, 1001, device="cuda", dtype=torch.bfloat16)
    with ember.config.patch(compile_workers=2):
        row_copy.compile_ahead(torch.bfloat16, 1001, 1008, 1001)
        loaded = ember.metrics.binaries_loaded
        row_copy.copy_rows(dst, src[:, :1001])
    torch.testing.assert_close(dst, src[:, :1001], rtol=0, atol=0)
    assert ember.metrics.binaries_loaded == loaded + 1
