"""One report per process (config.report): the graphs ember compiles, the profiled steps, the graph breaks
Dynamo logs, and the page written when the program ends.

Which steps are profiled: a step runs from one call of the first compiled graph the program calls (the
anchor, usually the forward of the model's first graph) to its next call. The profiler starts at the
anchor's call report_warmup + 1, once compiling, autotuning and caches are behind, and stops report_steps
steps later (or when the program ends). A graph compiled, or called for the first time, during those steps
restarts the count at the next anchor call (three times at most), so that the profile holds steady-state
calls only."""
from __future__ import annotations

import atexit
import itertools
import logging
import re
import sys
import time
from typing import Callable, Optional

import torch

from ..config import config
from ..runtime.ranges import profile_range
from .collect import GraphRecord
from .profile import RANGE_PREFIX, ProfileWindow, summarize

MAX_RESTARTS = 3

_recorder: Optional["ReportRecorder"] = None


def recorder() -> "ReportRecorder":
    """The report config.report asks for, started at its first use; written when the program ends."""
    global _recorder
    if _recorder is None or _recorder.finished or _recorder.path != config.report:
        _recorder = ReportRecorder(config.report, config.report_steps, config.report_warmup)
        atexit.register(_recorder.finish)
    return _recorder


class ReportRecorder:
    def __init__(self, path: str, steps: int, warmup: int):
        self.path, self.steps, self.warmup = path, max(1, steps), max(0, warmup)
        self.graphs: list[GraphRecord] = []
        self.ids = itertools.count()
        self.graph_breaks = GraphBreakLog()
        self.graph_breaks.install()
        self.anchor: Optional[GraphRecord] = None
        self.profiler = None
        self.window_start = 0.0
        self.window_steps = 0              # steps completed since the profiler started
        self.restarts = 0
        self.window: Optional[ProfileWindow] = None
        self.peak_memory_before = 0        # GPU bytes allocated at most before the profiled steps
        self.finished = False
        self.started = time.time()

    # -- compiling ------------------------------------------------------------------------------------------

    def begin_graph(self, kind: str) -> GraphRecord:
        """The record of a graph about to compile; it joins the report when it compiled (observe)."""
        graph_id = next(self.ids)
        if self.profiler is not None:
            self._restart()
        return GraphRecord(graph_id, kind, f"{RANGE_PREFIX}{graph_id}")

    def observe(self, record: GraphRecord, fn: Callable) -> Callable:
        """`fn` (a compiled graph's boxed call) counted for the step window, inside a profiler range."""
        self.graphs.append(record)
        name = record.range

        def call(args):
            self._before_call(record)
            with profile_range(name):
                return fn(args)
        return call

    # -- the profiled steps ---------------------------------------------------------------------------------

    def _before_call(self, record: GraphRecord) -> None:
        first_call = record.times_called == 0
        record.times_called += 1
        if self.window is not None or self.finished:
            return
        if self.anchor is None:
            self.anchor = record
        if self.profiler is not None:
            if first_call and self.restarts < MAX_RESTARTS:
                self._restart()
            elif record is self.anchor:
                self.window_steps += 1
                if self.window_steps >= self.steps:
                    self._stop(self.window_steps)
                return
        if self.profiler is None and record is self.anchor and record.times_called > self.warmup:
            self._start()

    def _uses_cuda(self) -> bool:
        return torch.cuda.is_available() and any("cuda" in g.device for g in self.graphs)

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if self._uses_cuda():
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()
            self.peak_memory_before = max(self.peak_memory_before, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        self.profiler = profile(activities=activities)
        self.profiler.start()
        self.window_steps = 0
        self.window_start = time.perf_counter()

    def _stop(self, steps: int) -> None:
        cuda = self._uses_cuda()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.window_start
        self.profiler.stop()
        peak = torch.cuda.max_memory_allocated() if cuda else None
        self.window = summarize(self.profiler.events(), steps, wall, peak)
        self.profiler = None

    def _restart(self) -> None:
        """Drop the steps profiled so far: a graph compiled or ran for the first time among them."""
        self.profiler.stop()
        self.profiler = None
        self.restarts += 1

    # -- the page -------------------------------------------------------------------------------------------

    def finish(self) -> Optional[str]:
        """Stop profiling if steps are still running, measure the rooflines and write the page."""
        if self.finished:
            return self.path
        self.finished = True
        self.graph_breaks.uninstall()
        if self.profiler is not None:
            self._stop(self.window_steps + 1)      # the program's end closes the step it was in
        from .page import write_page
        write_page(self)
        print(f"ember report: wrote {self.path}", file=sys.stderr)
        return self.path

    def status(self) -> str:
        """How the profiled steps came about, for the page."""
        if self.window is not None:
            restarted = f" (restarted {self.restarts} times: graphs compiled or first ran meanwhile)" if self.restarts else ""
            return (f"{self.window.steps} steps profiled after {self.warmup} warm-up steps{restarted}; a step runs "
                    f"from one call of graph {self.anchor.id} ({self.anchor.kind}) to its next")
        if not self.graphs:
            return "ember compiled no graph: nothing to profile (is the model compiled with backend=\"ember\"?)"
        anchor = self.anchor
        calls = anchor.times_called if anchor is not None else 0
        return (f"no step profiled: the first graph the program called ran {calls} times; profiling starts at its "
                f"call {self.warmup + 1} (EMBER_REPORT_WARMUP / --warmup) and a step ends at its next call")


class GraphBreakLog(logging.Handler):
    """The graph breaks Dynamo logs while the report runs: where in the user's code, and why."""
    _where = re.compile(r"in user code at (\S+:\d+)")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.breaks: dict = {}             # (where, reason) -> count
        self.logger = None
        self.saved = None

    def install(self) -> None:
        try:
            from torch._dynamo.symbolic_convert import graph_break_log
        except ImportError:
            return
        self.logger = graph_break_log
        self.saved = (graph_break_log.level, graph_break_log.propagate)
        if not graph_break_log.isEnabledFor(logging.DEBUG):
            # the user has not asked for these messages: receive them without passing them on to torch's handlers
            graph_break_log.setLevel(logging.DEBUG)
            graph_break_log.propagate = False
        graph_break_log.addHandler(self)

    def uninstall(self) -> None:
        if self.logger is not None:
            self.logger.removeHandler(self)
            self.logger.setLevel(self.saved[0])
            self.logger.propagate = self.saved[1]
            self.logger = None

    def emit(self, record) -> None:
        try:
            text = record.getMessage()
        except Exception:
            return
        where = self._where.search(text)
        reason = text.split("Graph Break Reason:", 1)[1].split("User code traceback:", 1)[0] \
            if "Graph Break Reason:" in text else ""
        key = (where.group(1) if where else "", brief_reason(reason))
        self.breaks[key] = self.breaks.get(key, 0) + 1

    def entries(self) -> list:
        """[(where, reason, count)]: the logged breaks, or Dynamo's counters of break reasons when none was
        logged (no location then)."""
        if self.breaks:
            return [(w, r, n) for (w, r), n in self.breaks.items()]
        from torch._dynamo.utils import counters
        return [("", brief_reason(reason), n) for reason, n in counters["graph_break"].items()]


def brief_reason(text: str) -> str:
    """Dynamo's break reason in a line: its title and its explanation, without hints and links."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    titles = [ln for ln in lines if not ln.startswith(("Encountered graph break", "Explanation:", "Hint:",
                                                        "Developer debug context:", "For more details"))]
    explanation = next((ln[len("Explanation:"):].strip() for ln in lines if ln.startswith("Explanation:")), "")
    title = titles[0] if titles else (lines[0] if lines else "")
    return f"{title}: {explanation}" if explanation else title
