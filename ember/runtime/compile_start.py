"""Work ember starts when Dynamo starts to compile a frame, before any backend sees its graph, and ends when
Dynamo's compile ends."""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("ember")


def call_at_compile_start(fn: Callable) -> None:
    """Have Dynamo call `fn(args)` when it starts each compile (of the outermost frame), registered once.
    `torch._dynamo.reset()` removes callbacks, so callers register again where a graph reaches ember."""
    _register("start", fn)


def call_at_compile_end(fn: Callable) -> None:
    """Have Dynamo call `fn(args)` when each compile ends, also when it raises; registered once."""
    _register("end", fn)


def _register(when: str, fn: Callable) -> None:
    try:
        from torch._dynamo.callback import callback_handler
        if fn not in getattr(callback_handler, f"{when}_callbacks"):
            getattr(callback_handler, f"register_{when}_callback")(fn)
    except (ImportError, AttributeError) as e:
        log.debug("ember: no Dynamo %s callback for %s (%s)", when, getattr(fn, "__name__", fn), e)
