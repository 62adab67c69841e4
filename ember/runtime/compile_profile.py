"""Where a graph's compile time goes: seconds per stage of compile_graph, added to
`ember.metrics.compile_seconds` and `ember.metrics.compile_stage_seconds`, and with
`ember.config.compile_profile` (EMBER_COMPILE_PROFILE=1) printed on stderr as one table per graph. While a
long compile runs on a terminal, runtime/progress.py shows its stage on one updating line.

A stage's seconds exclude the stages timed inside it (loading kernels happens inside rendering the
wrapper), so the stages add up to the graph's compile time, less the untimed rest ("other").
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import sys
import time
from typing import Iterator

from .. import metrics
from ..config import config
from .progress import ProgressLine

STAGES = ("cache lookup", "decompose", "post-grad passes", "lowering", "scheduling/fusion", "code generation",
          "render", "kernel compile/load", "cache store")

_current: contextvars.ContextVar = contextvars.ContextVar("ember_compile_profile", default=None)
_graph_numbers = itertools.count(1)


class CompileProfile:
    """The profile of one graph's compile: `with CompileProfile(kind) as p:` around it, `p.stage(name)`
    around each stage."""

    def __init__(self, kind: str):
        self.kind = kind
        self.seconds: dict[str, float] = {}
        self.cache = "off"                  # "hit", "miss" or "off", for the table
        self.kernels = 0
        self.number = next(_graph_numbers)
        self._open: list = []               # [stage, start, seconds of the stages inside it]
        self.progress = None

    def __enter__(self) -> "CompileProfile":
        self._start = time.perf_counter()
        self._token = _current.set(self)
        if ProgressLine.wanted():
            self.progress = ProgressLine(f"graph {self.number} ({self.kind})", self.current_stage).start()
        return self

    def __exit__(self, exc_type, *rest) -> bool:
        _current.reset(self._token)
        if self.progress is not None:
            self.progress.stop()
        total = time.perf_counter() - self._start
        metrics.compile_seconds += total
        for name, s in self.seconds.items():
            metrics.compile_stage_seconds[name] += s
        if config.compile_profile:
            print(self.table(total, failed=exc_type is not None), file=sys.stderr, flush=True)
        return False

    def current_stage(self) -> str:
        try:                                # read by the progress line's thread while stages open and close
            return self._open[-1][0]
        except IndexError:
            return ""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        entry = [name, time.perf_counter(), 0.0]
        self._open.append(entry)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.perf_counter() - entry[1]
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed - entry[2]
            if self._open:
                self._open[-1][2] += elapsed

    def table(self, total: float, failed: bool = False) -> str:
        outcome = "failed" if failed else f"{self.kernels} kernels, cache {self.cache}"
        lines = [f"ember compile profile: graph {self.number} ({self.kind}), {outcome}, {total:.3f} s",
                 f"  {'stage':<22}{'seconds':>9}{'share':>8}"]
        names = list(STAGES) + [n for n in self.seconds if n not in STAGES]
        for name in names + ["other"]:
            s = total - sum(self.seconds.values()) if name == "other" else self.seconds.get(name)
            if s is None:
                lines.append(f"  {name:<22}{'-':>9}{'':>8}")
            else:
                lines.append(f"  {name:<22}{s:9.3f}{100 * s / max(total, 1e-9):7.1f}%")
        return "\n".join(lines)


def kernels_compiled(done: int, total: int) -> None:
    """Progress of the kernel compiles of the graph being compiled, for its progress line."""
    profile = _current.get()
    if profile is not None and profile.progress is not None:
        profile.progress.kernels = (done, total)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """A stage of the graph being compiled (nothing is timed outside a compile)."""
    profile = _current.get()
    if profile is None:
        yield
        return
    with profile.stage(name):
        yield
