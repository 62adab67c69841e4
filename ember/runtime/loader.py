"""Load generated Python code (wrapper modules, Triton kernel modules) from files in the on-disk cache
(runtime/cache_dir.py), keyed by a hash of their source: Triton reads its kernels' source files. The code
run is compiled from the source in memory; the file is rewritten when it no longer holds that source."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import types

from .cache_dir import cache_root, mark_used, write_atomically


def cache_dir() -> str:
    """The cache root (created private if missing)."""
    return cache_root()


def _write(source: str, prefix: str) -> tuple[str, str]:
    data = source.encode()
    key = hashlib.sha256(data).hexdigest()[:20]
    sub = os.path.join(cache_dir(), key[:2])
    os.makedirs(sub, exist_ok=True)
    path = os.path.join(sub, f"{prefix}_{key}.py")
    try:
        with open(path, "rb") as f:
            intact = f.read() == data
    except OSError:
        intact = False
    if intact:
        mark_used(path)
    else:                       # new, or truncated or changed since it was written
        write_atomically(path, data)
    return f"{prefix}_{key}", path


def load_module(source: str, prefix: str, extra_globals: dict | None = None) -> types.ModuleType:
    name, path = _write(source, prefix)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if extra_globals:
        mod.__dict__.update(extra_globals)
    # compiled from `source`, not read back from the file (nor from a bytecode file beside it)
    exec(compile(source, path, "exec"), mod.__dict__)
    return mod


_triton_files: dict = {}      # (path, TRITON_INTERPRET's value) -> the module loaded from that file under it


def load_triton_file(path: str, prefix: str) -> types.ModuleType:
    """A file of hand-written @triton.jit functions (ember's kernel helpers, the row copy), loaded as
    generated kernels are, so that its cache path names its source for the compile workers. One module per
    TRITON_INTERPRET value: @triton.jit reads it when the module is loaded (an interpreted function, or a
    JITFunction, which an interpreted kernel cannot call), so a module loaded under one setting serves no
    kernel of the other."""
    key = (path, os.environ.get("TRITON_INTERPRET"))
    if key not in _triton_files:
        with open(path) as f:
            _triton_files[key] = load_module(f.read(), prefix)
    return _triton_files[key]
