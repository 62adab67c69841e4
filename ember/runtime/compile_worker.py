"""A compile worker: a separate Python process that compiles Triton kernels into Triton's on-disk cache.

Started by `compile_pool.py` as `python <this file> --zygote` (run by path, not `-m ember...`, so it does
not import ember, Dynamo or the user's `__main__`): that process imports torch and Triton's compiler once
and then forks a worker for each pair of pipes the parent sends it over its stdin (a Unix socket), so the
workers start past those imports. (Without fork, `python <this file>` is one worker on stdin and stdout.)
A worker reads jobs from its job pipe and answers on its answer pipe, each a length-prefixed pickle; its
first answer says it is ready and gives its pid. A job names a kernel module file, a kernel in it and the
arguments of its future launch; the worker runs Triton's own `JITFunction.warmup` with those, which
compiles exactly the binary the parent's first launch will look up, under the same cache key, and leaves
it in the cache. It answers with what launching each binary takes (`static_launch.binary_facts`: its file
in the cache, function name, warps, shared memory, parameter layout), so that a later process can load it
without the JIT.

The worker never touches the GPU: Triton's driver is told the target (architecture) the parent found,
and device/stream queries answer 0, so no CUDA context is created per worker.
"""
import importlib.util
import os
import pickle
import signal
import socket
import struct
import sys
import traceback


def _read(stream):
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


def _write(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _load(path: str, extra: dict):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__.update(extra)
    spec.loader.exec_module(mod)
    return mod


class CompileOnlyDriver:
    """Stands in for Triton's GPU driver: answers what compiling asks (the target) without a device."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    @property
    def utils(self):
        # building a launcher may ask for the driver's utilities (loading them creates no CUDA context)
        if "utils" not in self.__dict__:
            from triton.backends import backends
            self.__dict__["utils"] = backends[self.target.backend if self.target.backend != "cuda" else "nvidia"].driver().utils
        return self.__dict__["utils"]


def build_launcher(kernel) -> None:
    """Triton versions that build a C launcher per kernel signature (a C compile of about a second) do it
    at the kernel's first launch, one after another; building it here leaves it in the cache too."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:          # a launch builds it then; nothing is lost but time
        pass


class Worker:
    def __init__(self):
        self.modules: dict = {}
        self.target = None

    def _aim(self, target: tuple) -> None:
        if self.target == target:
            return
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver
        driver.set_active(CompileOnlyDriver(GPUTarget(*target)))
        self.target = target

    def _module(self, path: str, helpers_path: str):
        if path not in self.modules:
            extra = {}
            if helpers_path is not None:        # None: a module whose kernels call no helpers
                extra["helpers"] = self.modules.get(helpers_path) or _load(helpers_path, {})
                self.modules[helpers_path] = extra["helpers"]
            self.modules[path] = _load(path, extra)
        return self.modules[path]

    def compile(self, job: dict) -> list:
        """-> per config, its binary's facts (static_launch.binary_facts) or None."""
        # job["args"]: a torch.dtype per pointer (Triton's warm-up takes a dtype for a tensor), else ints
        self._aim(job["target"])
        fn = getattr(self._module(job["path"], job["helpers"]), job["kernel"])
        facts = []
        for meta in job["configs"]:
            kernel = fn.warmup(*job["args"], grid=(1,), **meta)
            facts.append(self._facts(job, kernel))
            if kernel is not None and facts[-1] is None:
                # only a binary torch's C launcher cannot take is launched through Triton's own launcher
                build_launcher(kernel)
        return facts

    def _facts(self, job: dict, kernel):
        if kernel is None or not job.get("static_launch"):
            return None
        try:
            if "static_launch" not in self.modules:
                self.modules["static_launch"] = _load(job["static_launch"], {})
            return self.modules["static_launch"].binary_facts(kernel, len(job["args"]))
        except Exception:          # the parent's first launch goes through the JIT, as without facts
            return None


def _preload() -> None:
    """Do what every job needs (import torch for the jobs' dtypes, Triton and its compiler: seconds; hash
    Triton's installation for its cache key: a third of a second) once, in the zygote, before any worker is
    forked: a zygote started while Dynamo traces (KernelBackend.warm_up) has its workers ready for the first
    jobs, which would otherwise pay for it."""
    try:
        import torch  # noqa: F401
        import triton.compiler.compiler  # noqa: F401
        import triton.language  # noqa: F401
        import triton.backends.nvidia.compiler  # noqa: F401
    except ImportError:              # the job that needs it reports the error
        return
    try:
        import triton.experimental.gluon  # noqa: F401   (a compile imports it)
    except ImportError:
        pass
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):       # where Triton versions keep it
        try:
            key = getattr(importlib.import_module(module), "triton_key", None)
            if key is not None:
                key()
                return
        except Exception:            # the first job computes it, and reports any error
            return


def run(jobs, answers) -> None:
    """Answer jobs until the parent closes the job pipe."""
    worker = Worker()
    _write(answers, {"ready": os.getpid()})
    while True:
        job = _read(jobs)
        if job is None:
            return
        try:
            _write(answers, {"facts": worker.compile(job)})
        except Exception:
            _write(answers, traceback.format_exc(limit=4))


def serve_forks(requests: socket.socket) -> None:
    """The zygote: each message on `requests` carries a worker's two pipe ends (job, answer); fork a worker
    on them. Returns when the parent closes the socket."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # the kernel reaps the workers; none is waited for
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(requests, 1, 2)
        except OSError:
            return
        if not message:
            return
        if len(fds) == 2 and os.fork() == 0:
            status = 0
            try:
                # Triton's compile waits for ptxas: the worker must see its children's exit status
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                requests.close()
                run(os.fdopen(fds[0], "rb"), os.fdopen(fds[1], "wb"))
            except BaseException:       # noqa: BLE001 - a broken pipe: the parent sees the worker gone
                status = 1
            finally:
                os._exit(status)
        for fd in fds:
            os.close(fd)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must not corrupt the answers
    _preload()
    if sys.argv[1:] == ["--zygote"]:
        serve_forks(socket.socket(fileno=stdin.fileno()))
    else:
        run(stdin, stdout)


if __name__ == "__main__":
    main()
