"""Triton's GPU driver of this process, loaded ahead of its first use.

The first use of `triton.runtime.driver.active` builds the driver, and on a machine whose Triton cache
holds no build of it yet, compiles its C utilities with the system's C compiler: 0.24-0.65 s on the main
thread of a cold first call (H200 host, Triton 3.6), between the graph's kernels being generated and their
compile jobs being sent. `load_ahead()` (called when Dynamo starts to compile for a GPU) builds it on a
thread while Dynamo and AOTAutograd trace; the compiler runs in a subprocess, so the thread holds the GIL
only for Triton's Python around it. ember's first use of the driver waits for that thread (`ready()`,
`active()`), so the main thread never builds a second driver beside it.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("ember")

_loading: list[threading.Thread] = []      # the thread load_ahead started, at most one per process


def _load() -> None:
    try:
        from triton.runtime import driver
        driver.active.get_current_target()
    except Exception as e:     # noqa: BLE001 - the first use on the main thread raises it where it matters
        log.debug("ember: Triton's driver not loaded ahead: %r", e)


def load_ahead() -> None:
    """Build Triton's driver on a thread, once per process."""
    if not _loading:
        thread = threading.Thread(target=_load, name="ember-triton-driver", daemon=True)
        _loading.append(thread)
        thread.start()


def ready() -> None:
    """Wait for the thread load_ahead started, if any."""
    for thread in _loading:
        thread.join()


def active():
    """Triton's active driver, once the thread load_ahead started (if any) is done."""
    ready()
    from triton.runtime import driver
    return driver.active
