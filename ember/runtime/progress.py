"""One updating line on stderr while a long compile runs: the graph, its stage, its kernels compiled so far
and the seconds it has taken. Shown only when stderr is a terminal, once a graph's compile has run
SHOW_AFTER_S, and never with ember.config.quiet (EMBER_QUIET=1); the line is cleared when the compile ends.

A background thread redraws the line; the compile itself only records what it is doing
(runtime/compile_profile.py: the stage; `kernels_compiled(done, total)` from whoever compiles kernels).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from ..config import config

SHOW_AFTER_S = 3.0
REDRAW_S = 0.5


class ProgressLine:
    def __init__(self, label: str, stage: Callable[[], str], stream=None):
        self.label, self.stage = label, stage
        self.stream = stream if stream is not None else sys.stderr
        self.kernels: tuple[int, int] | None = None
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._shown = False
        self._thread: threading.Thread | None = None

    @staticmethod
    def wanted(stream=None) -> bool:
        stream = stream if stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        return not config.quiet and bool(isatty and isatty())

    def start(self) -> "ProgressLine":
        self._thread = threading.Thread(target=self._run, name="ember-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self._write("\r\033[K")

    def text(self) -> str:
        parts = [f"ember: compiling {self.label}", self.stage() or "..."]
        if self.kernels is not None:
            parts.append(f"kernels {self.kernels[0]}/{self.kernels[1]}")
        parts.append(f"{time.perf_counter() - self._start:.0f} s")
        return ", ".join(parts)

    def _run(self) -> None:
        if self._stop.wait(SHOW_AFTER_S):
            return
        while not self._stop.is_set():
            self._shown = True
            self._write("\r\033[K" + self.text())
            self._stop.wait(REDRAW_S)

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):       # a closed or broken stream: nothing to show
            pass
