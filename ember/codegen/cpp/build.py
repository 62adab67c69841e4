"""Compile a graph's C++ kernels with the system compiler into one shared library, cache it on disk,
and load it in-process with ctypes.

The library is keyed by a hash of the source, the flags, the compiler's version and (because of
-march=native) the host CPU, so a cache directory shared between machines never hands one a library
built for another. Every file reused from the cache is checked first (the library and the precompiled
header against the checksum recorded when they were built, the probed flags by their own checksum): a
truncated or corrupted one is built again. The compiler's flags are probed once per compiler: a toolchain without OpenMP or
-march=native still works, single-threaded or generic; glibc's libmvec, where it links, gives the
vectorizer SIMD exp/log/sin/erf/tanh... With GCC the prelude is a precompiled header, which more
than halves the compile time of a small graph.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import threading
from typing import Callable

import torch

from ...runtime.cache_dir import read_checked, record_digest, verified, write_checked
from ...runtime.loader import cache_dir
from .prelude import PRELUDE

# -fwrapv: signed overflow wraps, as torch integer math does (and the optimizer may not assume it away).
# -fno-math-errno / -fno-trapping-math: no errno or FP-trap side effects, so sqrt and selects
# vectorize; neither changes any computed value (unlike -ffast-math, which would break NaN handling).
_BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
               "-fwrapv", "-fno-math-errno", "-fno-trapping-math"]
_OPTIONAL = ("-march=native", "-fopenmp")

_FIX = ("install a C++ compiler (e.g. `apt-get install g++`) or point the CXX environment variable at one, "
        "or run CPU kernels through Triton's interpreter with ember.config.cpu_backend = 'triton'")

_PROBE = r"""
#include <cmath>
extern "C" int probe(float* x, long n) {
  #pragma omp parallel for
  for (long i = 0; i < n; ++i) x[i] = std::exp(x[i]);
  return 0;
}
"""
_PROBE_MVEC = r"""
extern "C" int probe(float* x, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) x[i] = std::exp(x[i]) + std::erf(x[i]);
  return 0;
}
"""
_MVEC = (["-DEMBER_LIBMVEC"], ["-lmvec"])


class CppBuildError(RuntimeError):
    pass


_lock = threading.Lock()
_toolchain: dict = {}


def find_compiler() -> list[str]:
    env = os.environ.get("CXX")
    if env:
        cmd = shlex.split(env)
        if cmd and shutil.which(cmd[0]):
            return [shutil.which(cmd[0])] + cmd[1:]
        raise CppBuildError(f"ember's C++ backend: CXX={env!r} is not an executable compiler; {_FIX}")
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return [path]
    raise CppBuildError(f"ember's C++ backend found no C++ compiler (looked for $CXX, c++, g++, clang++); {_FIX}")


def host_tag() -> str:
    """The host CPU's model and ISA flags (what -march=native compiles for)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^(flags|Features)\s*:(.*)$", text, re.M)
        model = re.search(r"^model name\s*:(.*)$", text, re.M)
        return (m.group(2) if m else "") + (model.group(1) if model else "")
    except OSError:
        import platform
        return platform.machine() + platform.processor()


def _run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def _try_build(cxx: list[str], flags: list[str], source: str, libs: list[str] = (), load: bool = False) -> str:
    """'' if `source` builds into a shared library with these flags (and, with `load`, that library
    loads: a shared library links with undefined symbols), else what went wrong."""
    d = os.path.join(cache_dir(), "cpp")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, f"probe_{os.getpid()}_{threading.get_ident()}.cpp")
    with open(src, "w") as f:
        f.write(source)
    try:
        r = _run(cxx + flags + [src, "-o", f"{src}.so"] + list(libs))
        if r.returncode != 0:
            return r.stderr or "failed"
        if load:
            try:
                ctypes.CDLL(f"{src}.so")
            except OSError as e:
                return str(e)
        return ""
    finally:
        for p in (src, f"{src}.so"):
            if os.path.exists(p):
                os.remove(p)


def _probe_flags(cxx: list[str], version: str) -> tuple[list[str], list[str]]:
    """(flags, libraries): the full flags, minus what this toolchain rejects; remembered on disk."""
    d = os.path.join(cache_dir(), "cpp")
    os.makedirs(d, exist_ok=True)
    key = hashlib.sha256("\0".join(cxx + [version] + _BASE_FLAGS + _MVEC[1]).encode()).hexdigest()[:16]
    memo = os.path.join(d, f"flags_{key}.txt")
    known = read_checked(memo)
    if known is not None:
        flags, _, libs = known.decode().partition("|")
        return flags.split(), libs.split()
    candidates = [_BASE_FLAGS,
                  [f for f in _BASE_FLAGS if f != "-march=native"],
                  [f for f in _BASE_FLAGS if f != "-fopenmp"],
                  [f for f in _BASE_FLAGS if f not in _OPTIONAL]]
    chosen, err = None, ""
    for flags in candidates:
        err = _try_build(cxx, flags, _PROBE)
        if not err:
            chosen = flags
            break
    if chosen is None:
        raise CppBuildError(f"ember's C++ backend could not build a test library with {' '.join(cxx)}; {_FIX}\n"
                            f"compiler output (last lines):\n{_tail(err)}")
    libs: list[str] = []
    if not _try_build(cxx, chosen + _MVEC[0], PRELUDE + _PROBE_MVEC, _MVEC[1], load=True):
        chosen, libs = chosen + _MVEC[0], _MVEC[1]
    write_checked(memo, (" ".join(chosen) + "|" + " ".join(libs)).encode())
    return chosen, libs


def toolchain() -> tuple[list[str], str, list[str], list[str]]:
    """(compiler command, its version line, flags, libraries)"""
    with _lock:
        if "cxx" not in _toolchain:
            cxx = find_compiler()
            try:
                r = _run(cxx + ["--version"], timeout=60)
            except (OSError, subprocess.SubprocessError) as e:
                raise CppBuildError(f"ember's C++ backend could not run {' '.join(cxx)} ({e}); {_FIX}") from e
            version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"
            flags, libs = _probe_flags(cxx, version)
            _toolchain.update(cxx=cxx, version=version, flags=flags, libs=libs)
        return _toolchain["cxx"], _toolchain["version"], _toolchain["flags"], _toolchain["libs"]


def _prelude_header() -> str | None:
    """The prelude as a header with a GCC precompiled header next to it, or None (then every file
    carries the prelude as text). Parsing <cmath> is most of a small kernel file's compile time."""
    root = cache_dir()
    with _lock:
        known = _toolchain.setdefault("pch", {})
        # checked against its checksum once per process (below), then only seen to be there
        if root in known and (known[root] is None or os.path.exists(known[root] + ".gch")):
            return known[root]
    cxx, version, flags, _ = toolchain()
    header = None
    if "clang" not in version.lower():
        key = hashlib.sha256("\0".join([PRELUDE, " ".join(flags), version, " ".join(cxx), host_tag()]).encode())
        d = os.path.join(root, "cpp", f"prelude_{key.hexdigest()[:16]}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "ember_prelude.h")
        if not (verified(path + ".gch") and _holds(path, PRELUDE)):
            uniq = f"{os.getpid()}_{threading.get_ident()}"
            with open(f"{path}.{uniq}.tmp", "w") as f:
                f.write(PRELUDE)
            os.replace(f"{path}.{uniq}.tmp", path)
            compile_flags = [f for f in flags if f != "-shared"]
            try:
                r = _run(cxx + compile_flags + ["-x", "c++-header", path, "-o", f"{path}.gch.{uniq}"])
                if r.returncode == 0:
                    os.replace(f"{path}.gch.{uniq}", path + ".gch")
                    record_digest(path + ".gch")
            except (OSError, subprocess.SubprocessError):
                pass
            if verified(path + ".gch"):
                header = path
        else:
            header = path
    with _lock:
        _toolchain["pch"][root] = header
    return header


def _holds(path: str, text: str) -> bool:
    try:
        with open(path) as f:
            return f.read() == text
    except (OSError, UnicodeDecodeError):
        return False


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def build(source: str) -> str:
    """Compile `source` into a shared library (or find it in the cache); returns its path."""
    cxx, version, flags, libs = toolchain()
    tag = host_tag() if "-march=native" in flags else ""
    key = hashlib.sha256("\0".join([source, " ".join(flags + libs), version, " ".join(cxx), tag]).encode()).hexdigest()[:24]
    d = os.path.join(cache_dir(), "cpp", key[:2])
    os.makedirs(d, exist_ok=True)
    lib = os.path.join(d, f"ember_cpp_{key}.so")
    if verified(lib):
        return lib
    src = os.path.join(d, f"ember_cpp_{key}.cpp")
    uniq = f"{os.getpid()}_{threading.get_ident()}"
    header = _prelude_header() if source.startswith(PRELUDE) else None
    if header is not None:
        # GCC uses the .gch when the header is the file's first include (and its flags match; when
        # they do not, it silently reads the header as text)
        source = f'#include "{header}"\n' + source[len(PRELUDE):]
    with open(f"{src}.{uniq}.tmp", "w") as f:
        f.write(source)
    os.replace(f"{src}.{uniq}.tmp", src)
    tmp = f"{lib}.{uniq}.tmp"
    try:
        r = _run(cxx + flags + [src, "-o", tmp] + libs)
    except (OSError, subprocess.SubprocessError) as e:
        raise CppBuildError(f"ember's C++ backend could not run {' '.join(cxx)} ({e}); {_FIX}") from e
    if r.returncode != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise CppBuildError(
            f"ember's C++ backend failed to compile {src} with {' '.join(cxx + flags)} (a working compiler "
            f"rejecting generated code is an ember bug: please report it). To fix: {_FIX}.\n"
            f"compiler output (last lines):\n{_tail(r.stderr)}")
    os.replace(tmp, lib)  # atomic: a concurrent build of the same key just replaces an identical file
    record_digest(lib)
    return lib


# -- loading ------------------------------------------------------------------------------------------

_libs: dict[str, ctypes.CDLL] = {}


class CppLauncher:
    """`launcher[grid](*args, **meta)` like a Triton kernel: tensors become data pointers, ints stay
    ints, and the thread count is read at each call (torch.set_num_threads applies at once). `grid`
    and `meta` are ignored: the kernel splits its own work between threads."""

    def __init__(self, lib: ctypes.CDLL, name: str, nptr: int, nint: int):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * nptr + [ctypes.c_int64] * nint + [ctypes.c_int]
        fn.restype = ctypes.c_int
        self.name, self.lib, self.fn = name, lib, fn
        self.launch = self._specialize(nptr, nint, "launch", [], ["**meta"])
        self._site = self._specialize(nptr, nint, "site", ["grid"], [])

    def _specialize(self, nptr: int, nint: int, name: str, before: list, after: list):
        # a generated function with one parameter per argument: no per-call list or slicing
        ptrs = [f"p{i}" for i in range(nptr)]
        ints = [f"n{i}" for i in range(nint)]
        call = ", ".join([f"{p}.data_ptr()" for p in ptrs] + ints + ["threads()"])
        src = (f"def {name}({', '.join(before + ptrs + ints + after)}):\n"
               f"    if fn({call}):\n"
               f"        raise IndexError('ember: an index is out of range in kernel {self.name}')\n")
        scope = {"fn": self.fn, "threads": torch.get_num_threads}
        exec(compile(src, f"<ember launcher {self.name}>", "exec"), scope)
        return scope[name]

    def site(self, meta: dict, rebind) -> Callable:
        """A wrapper line's launch function, `site(grid, *args)` (runtime/launch.py, `call_site`)."""
        return self._site

    def __getitem__(self, grid):
        return self.launch

    def __call__(self, *args, **meta):
        return self.launch(*args, **meta)


def load_library(source: str) -> ctypes.CDLL:
    path = build(source)
    if path not in _libs:
        _libs[path] = ctypes.CDLL(path)
    return _libs[path]


def load_cpp_kernels(kernels) -> dict:
    """The C++ DefineKernel lines of one graph -> {kernel name: launcher}, built as one library."""
    if not kernels:
        return {}
    source = PRELUDE + "\n" + "\n".join(k.source for k in kernels)
    lib = load_library(source)
    out = {}
    for k in kernels:
        out[k.name] = CppLauncher(lib, k.name, len(k.signature.pointers), len(k.signature.sizes))
    return out
