"""All of ember's global state, in one place: context variables bound while a graph compiles.

- `ops_handler`: the handler that `ember.ir.ops.ops.<name>(...)` calls dispatch to. The same define-by-run
  `inner_fn` runs under a recording handler (dependencies), a kernel handler (code), a counting handler...
- `graph`: the GraphLowering being built (lowerings register buffers with it).
- `kernel`: the kernel whose code is being generated (the codegen handler writes into it).

Nothing else in ember keeps module-level mutable state except `ember.config` (settings),
`ember.metrics` (counters a user reads) and three process-wide resources that no compile's context
changes: the loaded Triton helper module (`runtime/loader.py`), the C++ toolchain found on the machine
(`codegen/cpp/build.py`) and the pool of compile workers (`runtime/compile_pool.py`).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

ops_handler: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_ops_handler", default=None)
graph: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_graph", default=None)
kernel: contextvars.ContextVar[Any] = contextvars.ContextVar("ember_kernel", default=None)


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
