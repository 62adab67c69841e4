"""Python's cyclic garbage collector paused while ember compiles.

A compile allocates hundreds of thousands of small objects (FX nodes, sympy expressions, IR closures), so
the collector's allocation thresholds trigger collections of the oldest generation, each of which walks
every object the program holds (the model, Dynamo's and AOTAutograd's graphs) while freeing little: the
compile's objects are still in use. Paused, the garbage of a compile waits for the next collection after
it, which the allocations made meanwhile start soon after; memory freed by reference counting (almost
all of it) is freed as usual. Explicit `gc.collect()` calls still collect.

Dynamo's trace of a frame compiled for ember is paused likewise, from Dynamo's compile start to its end
(`pause_for_dynamo` and `resume_after_dynamo`, called back by Dynamo): on a warm start that trace is most
of the first call, and one full collection in it took 0.2-0.4 s (a GPT-style training step's warm first
call on the CPU box went from 0.94-0.98 s to 0.76-0.79 s, docs/performance.md "Warm first calls: what the
main thread does")."""
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


_dynamo_pause = contextlib.ExitStack()      # holds a gc_paused() block while Dynamo compiles a frame for ember


def pause_for_dynamo() -> None:
    """Dynamo starts to compile a frame for ember: `gc_paused()` entered, until `resume_after_dynamo`."""
    _dynamo_pause.enter_context(gc_paused())


def resume_after_dynamo() -> None:
    """Dynamo's compile ended (or raised): the collector as it was before `pause_for_dynamo`."""
    _dynamo_pause.close()
