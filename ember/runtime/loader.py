"""Load generated code: kernel modules written to an on-disk cache (Triton reads its kernels' source
files) and wrapper modules, keyed by a hash of their source."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import types

from .. import config

_HEADER = {
    "triton": "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n",
    "triton-interpret": "import triton\nimport triton.language as tl\n"
                        "from ember.codegen.triton import interp_libdevice as libdevice\n",
}


def cache_dir() -> str:
    d = os.environ.get("EMBER_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"ember_cache_{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def _write(source: str, prefix: str) -> tuple[str, str]:
    key = hashlib.sha256(source.encode()).hexdigest()[:20]
    sub = os.path.join(cache_dir(), key[:2])
    os.makedirs(sub, exist_ok=True)
    path = os.path.join(sub, f"{prefix}_{key}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    return f"{prefix}_{key}", path


def load_module(source: str, prefix: str, extra_globals: dict | None = None) -> types.ModuleType:
    name, path = _write(source, prefix)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if extra_globals:
        mod.__dict__.update(extra_globals)
    spec.loader.exec_module(mod)
    return mod


def check_interpreter() -> None:
    """Triton's interpreter works only if TRITON_INTERPRET=1 was set before triton was imported (its
    library functions are wrapped at import); say so plainly instead of failing inside a kernel."""
    import triton.language as tl
    if not _interpreted(tl.standard.sum):
        raise RuntimeError(
            "ember runs Triton kernels for CPU tensors through the Triton interpreter, which needs "
            "TRITON_INTERPRET=1 in the environment before triton is imported. Set it when starting "
            "Python, import ember before anything imports triton, or use ember.config.cpu_backend='cpp'.")


def _interpreted(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(fn, InterpretedFunction)


_helpers: dict = {}


def triton_helpers() -> types.ModuleType:
    """ember.codegen.triton.helpers, loaded from its file (so it follows the interpreter setting)."""
    if "mod" not in _helpers:
        src_path = os.path.join(os.path.dirname(__file__), "..", "codegen", "triton", "helpers.py")
        with open(src_path) as f:
            _helpers["mod"] = load_module(f.read(), "ember_helpers")
    return _helpers["mod"]


def load_triton_kernels(kernels, backend: str) -> dict:
    """DefineKernel lines of one backend -> {kernel name: launchable}."""
    if not kernels:
        return {}
    if backend == "triton-interpret":
        check_interpreter()
    source = _HEADER[backend] + "\n\n" + "\n\n".join(k.source for k in kernels)
    mod = load_module(source, "ember_kernels", {"helpers": triton_helpers()})
    if backend == "triton":
        from .compile_pool import precompile
        precompile(mod, triton_helpers(), kernels)
    from .autotune import Autotuned

    def launchable(fn):
        if backend != "triton" or not config.fast_launch or _interpreted(fn):
            return fn
        from .launch import Launcher
        return Launcher(fn)
    return {k.name: Autotuned(launchable(getattr(mod, k.name)), k.tuning, k.source) if k.tuning
            else launchable(getattr(mod, k.name)) for k in kernels}
