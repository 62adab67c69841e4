"""Compile a graph's Triton kernels in parallel, before its first call.

Triton compiles a kernel at its first launch, one after another and mostly under the GIL: a training
graph of a few hundred kernels (with autotuning, several configs each) spent minutes there. Instead,
when a graph's kernels are loaded, every (kernel, launch config) pair is sent to a pool of worker
processes (`compile_worker.py`), which run Triton's own warm-up with the arguments the wrapper will pass
(dtypes of the pointers, the sizes) and so leave each binary in Triton's on-disk cache under the key the
first launch computes. The launches then load binaries instead of compiling them. A worker that fails
changes nothing but speed: the launch compiles the kernel itself and reports any error as before.

The workers are forked from one process, the zygote, which imports torch and Triton's compiler once
(`boot()`): on a 16-core H200 host one process took 4.2 s to import them, and 15 workers importing them at
once 6.3 s, slowing the parent's trace beside them. The zygote boots when Dynamo starts to compile on a
machine with a GPU, or when a graph with GPU tensors reaches ember (`TritonBackend.warm_up`); the workers
are forked when AOTAutograd begins to trace such a graph (`TritonBackend.prepare`), or at the latest when
the first GPU kernel is generated (`start()`), and live until exit. `config.compile_workers` sets their
number (0 or 1: compile at first launch, in process). Jobs that all compiled once leave a marker in ember's
cache (named by the jobs, Triton's version and its cache directory): a later process loading the same
kernels (a warm start from the graph cache) sends nothing and starts no workers. The marker (checksummed)
holds what the workers said of each binary (its file in Triton's cache and that file's SHA-256, function
name, warps, shared memory, parameter layout: `static_launch.binary_facts`): that process's Launchers load
each binary with torch's C launcher at its first launch, without Triton's JIT (runtime/launch.py), where
the call is the one the binary was built for.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import metrics
from ..config import config
from . import triton_driver
from .compile_profile import kernels_compiled

log = logging.getLogger("ember")
JOB_TIMEOUT_S = 600.0      # one (kernel, config) compile; Triton takes seconds, autotuned giants a minute
BOOT_TIMEOUT_S = 300.0     # a worker's first word: the zygote's imports take seconds
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")


@dataclasses.dataclass
class WarmSpec:
    """How the wrapper will launch a kernel, as far as Triton's compile cache key depends on it."""
    args: list           # a torch.dtype per pointer argument, an int per size (a hint for a symbol)
    configs: list        # launch metas to compile: the kernel's one config, or every autotuning candidate


@dataclasses.dataclass
class Build:
    """A kernel of a module for the workers to build, named as a DefineKernel names it (runtime/row_copy.py's
    kernel, which no graph defines)."""
    name: str
    warm: WarmSpec


def _worker_env() -> dict:
    # the interpreter's kernels compile nothing: workers always run real Triton
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _worker_stderr():
    return None if os.environ.get("EMBER_COMPILE_WORKER_LOG") else subprocess.DEVNULL


def forks_workers() -> bool:
    """Whether workers can be forked from a zygote (Unix: fork, and descriptors passed over a socket)."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds")


class _Zygote:
    """The process the workers are forked from (compile_worker.serve_forks), past its imports."""

    def __init__(self):
        self.requests, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, WORKER, "--zygote"], stdin=theirs, stdout=subprocess.DEVNULL,
                                     stderr=_worker_stderr(), env=_worker_env())
        theirs.close()
        self.lock = threading.Lock()

    def fork(self):
        """A new worker: (the file its jobs are written to, the file its answers are read from). It is forked
        once the zygote has booted; until then the request waits in the socket."""
        job_r, job_w = os.pipe()
        answer_r, answer_w = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.requests, [b"w"], [job_r, answer_w])
        finally:                  # the zygote holds its own copies now (or died: the worker reads as exited)
            os.close(job_r)
            os.close(answer_w)
        return os.fdopen(job_w, "wb"), os.fdopen(answer_r, "rb")

    def close(self) -> None:
        # the zygote returns at the end of its socket; each forked worker at the end of its job pipe
        self.requests.close()


class _Process:
    """One worker, as its two pipes; forked from `zygote`, or a process of its own without one."""

    def __init__(self, zygote: _Zygote | None = None):
        self.proc = None
        if zygote is not None:
            self.stdin, self.stdout = zygote.fork()
        else:
            self.proc = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=_worker_env(), stderr=_worker_stderr())
            self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.pid = None           # said by the worker when it is ready

    def kill(self) -> None:
        try:
            if self.pid is not None:
                os.kill(self.pid, signal.SIGKILL)
            elif self.proc is not None:
                self.proc.kill()
        except OSError:
            pass

    def _read(self, timeout: float):
        # a worker stuck on one kernel (never seen, but a hang would stop the user's program) is killed
        # after `timeout` seconds: its jobs then fail, and their kernels compile at their first launch
        if not select.select([self.stdout], [], [], timeout)[0]:
            self.kill()
            what = "on one kernel" if self.pid is not None else "to start"
            raise RuntimeError(f"ember compile worker took longer than {timeout:.0f} s {what}; stopped")
        head = self.stdout.read(4)
        if len(head) < 4:
            raise RuntimeError("ember compile worker exited")
        return pickle.loads(self.stdout.read(struct.unpack("<I", head)[0]))

    def ask(self, job: dict):
        if self.pid is None:
            self.pid = self._read(BOOT_TIMEOUT_S)["ready"]
        data = pickle.dumps(job)
        self.stdin.write(struct.pack("<I", len(data)) + data)
        self.stdin.flush()
        return self._read(JOB_TIMEOUT_S)

    def close(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass


class CompilePool:
    def __init__(self, n: int, zygote: _Zygote | None = None):
        """`n` workers, forked from `zygote` (a new one where none is given and forking is supported)."""
        self.zygote = zygote if zygote is not None or not forks_workers() else _Zygote()
        self.broken = False
        try:
            self.workers = [_Process(self.zygote) for _ in range(n)]
        except OSError as e:      # a zygote booted ahead died since: kernels compile at their first launch
            log.debug("ember: no compile workers: %s", e)
            self.workers, self.broken = [], True
        self.free = list(self.workers)
        self.lock = threading.Condition()
        self.threads = ThreadPoolExecutor(n, thread_name_prefix="ember-compile")
        self.warned = False       # that every job failed: said once

    def _ask(self, job: dict):
        with self.lock:
            while not self.free:
                self.lock.wait()
            w = self.free.pop()
        try:
            return w.ask(job)
        finally:
            with self.lock:
                self.free.append(w)
                self.lock.notify()

    def run(self, jobs: list, facts: list | None = None) -> list:
        """Run every job; -> a list of error texts (empty when all compiled). `facts`, when given, gets per
        job the workers' facts of its binaries (one per config; None for a failed job)."""
        errors = []
        for done, fut in enumerate([self.threads.submit(self._ask, j) for j in jobs]):
            kernels_compiled(done, len(jobs))
            try:
                answer = fut.result()
            except Exception as e:            # a worker died: stop using the pool, launches compile
                self.broken = True
                answer = str(e)
            if isinstance(answer, str):
                errors.append(answer)
            if facts is not None:
                facts.append(answer.get("facts") if isinstance(answer, dict) else None)
        return errors

    def close(self) -> None:
        for w in self.workers:
            w.close()
        if self.zygote is not None:
            self.zygote.close()
        self.threads.shutdown(wait=False)


_pool: list = []          # the process's one pool, once started (a process-wide resource, see state.py)
_zygote: list = []        # the process's zygote, booted ahead of the pool


def _workers() -> int:
    return config.compile_workers if config.compile_workers is not None else min(16, os.cpu_count() or 1)


def boot() -> None:
    """Start the process's zygote, once, where workers will be forked (it imports in the background), and
    build Triton's driver on a thread (runtime/triton_driver.py)."""
    triton_driver.load_ahead()
    if not _zygote and not _pool and _workers() >= 2 and forks_workers():
        _zygote.append(_Zygote())


_starting = threading.Lock()      # the pool starts once, from whichever thread asks first


def start() -> CompilePool | None:
    """The pool, started on first use (its workers boot while the graph is lowered and scheduled)."""
    if _workers() < 2:
        return None
    with _starting:
        if not _pool:
            _pool.append(CompilePool(_workers(), _zygote.pop() if _zygote else None))
            atexit.register(_pool[0].close)
    return None if _pool[0].broken else _pool[0]


def _target() -> tuple:
    t = triton_driver.active().get_current_target()
    return (t.backend, t.arch, t.warp_size)


def config_key(meta: dict) -> str:
    """A launch config as a key of the binaries' facts (the same in the process that reads the marker)."""
    return repr(sorted(meta.items()))


def precompile(module, helpers, kernels: list, min_jobs: int = 2) -> dict:
    """Compile every launch config of these DefineKernels (of `module`; `helpers`: the module its kernels
    call, or None) in the pool; returns when done, with {kernel name: {config_key(config): its binary's
    facts}} for the binaries the C launcher can take. Fewer than `min_jobs` configs compile at their first
    launch instead (one kernel compiles as fast there as through a worker, unless the main thread has
    better to do).
    Jobs the pool has compiled before (a warm start: the same module, helpers, target and Triton cache) are
    not sent again, their facts read from the marker, and a warm start with nothing to send starts no workers."""
    from . import static_launch
    triton_driver.ready()       # the kernels launch next: with the driver built ahead, never a second one
    specs = [(k.name, k.warm, cfg) for k in kernels if k.warm is not None for cfg in k.warm.configs]
    if _workers() < 2 or len(specs) < min_jobs:
        return {}
    target = _target()
    jobs = [{"path": module.__file__, "helpers": helpers.__file__ if helpers is not None else None,
             "kernel": name, "target": target,
             "args": warm.args, "configs": [cfg], "static_launch": static_launch.__file__}
            for name, warm, cfg in specs]
    marker = _done_marker(jobs)
    if marker is not None and os.path.exists(marker):
        log.debug("ember: %d kernel configs compiled by an earlier process; no workers asked", len(jobs))
        return _read_marker(marker)
    pool = start()
    if pool is None:
        return {}
    answers: list = []
    errors = pool.run(jobs, answers)
    binaries: dict = {}
    for (name, _, cfg), facts in zip(specs, answers):
        if facts and facts[0] is not None:
            binaries.setdefault(name, {})[config_key(cfg)] = facts[0]
    if not errors and marker is not None:
        _write_marker(marker, binaries)
    for err in errors:
        log.debug("ember: a compile worker could not compile a kernel (its launch will): %s", err)
    if errors and len(errors) == len(jobs) and not pool.warned:
        pool.warned = True
        log.warning("ember: the compile workers failed on every kernel, so kernels compile one by one at their "
                    "first launch (slower; set ember.config.compile_workers=0 to skip the pool). First error:\n%s",
                    errors[0])
    return binaries


# Set while a graph whose kernels may finish compiling after its compile returns is loaded (a training
# step's forward graph: AOTAutograd compiles its backward next, and that backward's lowering then runs
# while the workers compile the forward's kernels)
_waits_at_first_launch = contextvars.ContextVar("ember_waits_at_first_launch", default=False)


@contextlib.contextmanager
def kernels_waited_for_at_first_launch():
    token = _waits_at_first_launch.set(True)
    try:
        yield
    finally:
        _waits_at_first_launch.reset(token)


def waits_at_first_launch() -> bool:
    return _waits_at_first_launch.get()


_ahead: list = []         # the threads that run precompile_ahead's calls, once started


def precompile_ahead(module, helpers, kernels: list, min_jobs: int = 2) -> "PendingBinaries":
    """precompile(module, helpers, kernels, min_jobs) on a thread of its own: returns at once, and the first launch
    that asks for a binary waits for all of them (PendingBinaries). Several graphs' calls (a step split by
    graph breaks) send their jobs to the workers without waiting for each other's."""
    with _starting:
        if not _ahead:
            _ahead.append(ThreadPoolExecutor(4, thread_name_prefix="ember-precompile"))
    return PendingBinaries(_ahead[0].submit(precompile, module, helpers, kernels, min_jobs))


class PendingBinaries:
    """What precompile_ahead's call returns, once it has: {kernel name: {config key: binary facts}}."""

    def __init__(self, future):
        self._future, self._lock, self._binaries = future, threading.Lock(), None

    def result(self) -> dict:
        with self._lock:
            if self._binaries is None:
                start = time.perf_counter()
                try:
                    self._binaries = self._future.result()
                except Exception as e:      # noqa: BLE001 - without the binaries the launches compile them
                    log.debug("ember: precompiling kernels failed (their launches compile them): %s", e)
                    self._binaries = {}
                # the wait is ember's compile, finished here instead of inside the graph's compile
                metrics.compile_seconds += time.perf_counter() - start
            return self._binaries

    def get(self, kernel: str) -> "KernelBinaries":
        """One kernel's binaries, read as precompile's dict is read: {kernel name: its binaries}."""
        return KernelBinaries(self, kernel)


class KernelBinaries:
    """One kernel's binaries of a PendingBinaries, read as runtime/launch.Launcher reads its dict: the
    first `get` waits for the workers."""

    def __init__(self, pending: PendingBinaries, kernel: str):
        self.pending, self.kernel = pending, kernel

    def __bool__(self) -> bool:
        return True

    def get(self, key, default=None):
        return self.pending.result().get(self.kernel, {}).get(key, default)


def _done_marker(jobs: list) -> str | None:
    """The file that says these jobs all compiled into the current Triton cache: named by the jobs (module
    and helpers paths, which hold their sources' hashes; kernels, arguments, configs, target), Triton's
    version and its cache directory, under ember's cache. If Triton's cache loses a binary anyway, its
    first launch compiles it, as without workers."""
    try:
        import triton
        from .loader import cache_dir
        triton_cache = _triton_cache_dir()
        if not triton_cache or not os.path.isdir(triton_cache):
            return None
        key = hashlib.sha256(repr((jobs, triton.__version__, os.path.abspath(triton_cache))).encode()).hexdigest()
        return os.path.join(cache_dir(), "precompiled", key[:32])
    except Exception as e:          # noqa: BLE001 - without a marker the jobs run, as always
        log.debug("ember: no precompile marker: %s", e)
        return None


def _write_marker(path: str, binaries: dict) -> None:
    from .cache_dir import write_checked
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_checked(path, json.dumps(binaries).encode())
    except (OSError, TypeError, ValueError) as e:
        log.debug("ember: precompile marker not written: %s", e)


def _read_marker(path: str) -> dict:
    """The binaries' facts a marker holds; {} for a marker without them (an older one, a truncated or
    corrupted one: its checksum fails): the launches then go through the JIT, which finds the binaries in
    Triton's cache."""
    from .cache_dir import read_checked
    payload = read_checked(path)
    try:
        binaries = json.loads(payload) if payload is not None else None
    except ValueError:
        binaries = None
    if not isinstance(binaries, dict):
        log.debug("ember: precompile marker %s holds no binaries' facts; the kernels load through the JIT", path)
        return {}
    return binaries


def _triton_cache_dir() -> str | None:
    try:
        from triton import knobs            # Triton >= 3.4
        return knobs.cache.dir
    except (ImportError, AttributeError):
        from triton.runtime.cache import default_cache_dir
        return os.environ.get("TRITON_CACHE_DIR") or default_cache_dir()

