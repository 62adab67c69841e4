"""The context variables bound while a graph compiles: ember's per-compile state, in one place.

- `ops_handler`: the handler that `ember.ir.ops.ops.<name>(...)` calls dispatch to. The same define-by-run
  `inner_fn` runs under a recording handler (dependencies), a kernel handler (code), a counting handler...
- `graph`: the GraphLowering being built (lowerings register buffers with it; size hints and guards are
  asked of it while the graph is scheduled and its code generated).

Besides these, ember's module-level state is: `ember.config` (settings), `ember.metrics` (counters a user
reads); tables filled once as ember is imported (the lowerings of lowering/registry.py, and the ops they
lower, published to graph/decompose.py); caches of what a process never changes (the decomposition table,
each pattern's traced graphs); and three process-wide resources: the loaded Triton helper module
(`runtime/loader.py`), the C++ toolchain found on the machine (`codegen/cpp/build.py`) and the pool of
compile workers (`runtime/compile_pool.py`). The compile profile of the graph being compiled is a context
variable of `runtime/compile_profile.py`, which times stages and reads nothing else.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

ops_handler: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_ops_handler", default=None)
graph: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_graph", default=None)


@contextlib.contextmanager
def bind(var: contextvars.ContextVar, value: Any) -> Iterator[Any]:
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def current_graph():
    g = graph.get()
    if g is None:
        raise RuntimeError("no ember graph is being lowered (state.graph is unbound)")
    return g
