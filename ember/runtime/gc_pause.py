"""Python's cyclic garbage collector paused while ember compiles.

A compile allocates hundreds of thousands of small objects (FX nodes, sympy expressions, IR closures), so
the collector's allocation thresholds trigger collections of the oldest generation, each of which walks
every object the program holds (the model, Dynamo's and AOTAutograd's graphs) while freeing little: the
compile's objects are still in use. Paused, the garbage of a compile waits for the next collection after
it, which the allocations made meanwhile start soon after; memory freed by reference counting (almost
all of it) is freed as usual. Explicit `gc.collect()` calls still collect."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block; the collector's state before it afterwards (nesting
    and a collector the program turned off are kept as they are)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
