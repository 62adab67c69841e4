"""Load generated Python code (wrapper modules, Triton kernel modules) from files in an on-disk cache,
keyed by a hash of their source: Triton reads its kernels' source files."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import types


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
