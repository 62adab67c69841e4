"""Work ember starts when Dynamo starts to compile a frame, before any backend sees its graph."""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("ember")


def call_at_compile_start(fn: Callable) -> None:
    """Have Dynamo call `fn(args)` when it starts each compile, registered once. `torch._dynamo.reset()`
    removes callbacks, so callers register again where a graph reaches ember."""
    try:
        from torch._dynamo.callback import callback_handler
        if fn not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(fn)
    except (ImportError, AttributeError) as e:
        log.debug("ember: no Dynamo start callback for %s (%s); it runs when a graph reaches ember",
                  getattr(fn, "__name__", fn), e)
