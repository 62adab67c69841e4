"""Triton's key of its own installation, hashed in the background before the first launch needs it.

Every Triton cache lookup (a compile, or the first launch of a kernel that finds its binary in the cache)
is keyed by `triton_key()`: a hash of Triton's Python sources and its compiled library, computed once per
process. It took 0.45 s (under cProfile) of a warm start's first step on an H100 (docs/performance.md,
"Warm starts without inductor's code generators"), and 0.32 s of a compile worker's first compile on the
CPU box. Reading and hashing files release the GIL, so a thread started when a GPU graph reaches ember
computes it while Dynamo, AOTAutograd and ember work; the compile workers compute it while they boot
(compile_worker.py). The function is Triton's own, cached by Triton; a launch that comes first computes it
itself, as without the thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

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


def hash_in_background() -> Optional[threading.Thread]:
    """Start computing Triton's key in a daemon thread, once per process; the thread (None if there is no
    key to compute)."""
    if _started:
        return _started[0]
    fn = key_function()
    if fn is None:
        return None

    def compute():
        try:
            fn()
        except Exception as e:      # noqa: BLE001 - the first launch computes it, and reports any error
            log.debug("ember: Triton's cache key was not computed ahead: %s", e)

    thread = threading.Thread(target=compute, name="ember-triton-key", daemon=True)
    _started.append(thread)
    thread.start()
    return thread
