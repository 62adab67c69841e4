"""Keys of installed sources, hashed in the background before a first call needs them.

Two hashes of many files are computed once per process, inside the first call of a compiled program:
- Triton's key of its own installation (`triton_key`: its Python sources and its compiled library). Every
  Triton cache lookup needs it (a compile, or the first launch of a kernel whose binary is cached), and so
  does AOTAutograd's cache key, through inductor's description of the system. It took 0.45 s (under
  cProfile) of a warm start's first step on an H100 (docs/performance.md, "Warm starts without inductor's
  code generators"), 0.28 s of a warm start's cache key on the CPU box, and 0.32 s of a compile worker's
  first compile there.
- torch's key of its sources (inductor's `torch_key`), part of AOTAutograd's cache key.

Reading and hashing files release the GIL, so both are computed in the background from the moment Dynamo
starts its first compile of the process (a start callback registered when ember is imported, `install`): a
warm start's trace takes a second or more before AOTAutograd looks its cache up. A graph reaching ember
starts them too (`start`), where that callback was removed (`torch._dynamo.reset()` clears callbacks).
Where torch's functions can compute ahead themselves (`.prefetch()`, torch >= 2.13), a caller that comes
first waits for that computation; elsewhere a thread calls the functions, which cache their value, and a
caller that comes first computes it itself, as without the thread. The compile workers compute Triton's
key while they boot (compile_worker.py).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from .compile_start import call_at_compile_start

log = logging.getLogger("ember")
_started: list = []


def key_function() -> Optional[Callable[[], str]]:
    """Triton's `triton_key` (its place moved between versions), or None."""
    try:
        from triton.runtime.cache import triton_key          # Triton >= 3.3
        return triton_key
    except ImportError:
        try:
            from triton.compiler.compiler import triton_key
            return triton_key
        except ImportError:
            return None


def _inductor_keys() -> dict:
    """inductor's cached `triton_key` and `torch_key`, which AOTAutograd's cache key reads, by name."""
    try:
        from torch._inductor import codecache
    except ImportError:
        return {}
    return {name: getattr(codecache, name) for name in ("triton_key", "torch_key") if hasattr(codecache, name)}


def hash_in_background() -> Optional[threading.Thread]:
    """Start computing the keys, once per process: torch's own prefetch where its functions have one, a
    daemon thread for the rest; the thread (None if it has nothing to compute)."""
    if _started:
        return _started[0]
    rest, prefetched = [], set()
    for name, fn in _inductor_keys().items():
        if hasattr(fn, "prefetch"):
            fn.prefetch()
            prefetched.add(name)
        else:
            rest.append(fn)
    triton = key_function()
    if triton is not None and "triton_key" not in prefetched:
        rest.insert(0, triton)      # else inductor's prefetched triton_key computes Triton's own
    if not rest:
        _started.append(None)
        return None

    def compute():
        for fn in rest:
            try:
                fn()
            except Exception as e:      # noqa: BLE001 - the caller that needs it computes it, and reports errors
                log.debug("ember: %s was not computed ahead: %s", getattr(fn, "__name__", fn), e)

    thread = threading.Thread(target=compute, name="ember-source-keys", daemon=True)
    _started.append(thread)
    thread.start()
    return thread


def _on_compile_start(args) -> None:
    if not _started:
        hash_in_background()


def start() -> None:
    """Where a graph reaches ember: the keys, if nothing started them, and the callback again for the next
    compile, which `torch._dynamo.reset()` removes."""
    install()
    hash_in_background()


def install() -> None:
    """Start the hashing when Dynamo starts its first compile (any backend's: its keys are the same)."""
    call_at_compile_start(_on_compile_start)
