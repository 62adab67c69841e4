"""The profiled steps, joined with the compiled graphs: each device call's time per step (from the profiler
range the wrapper opened around it), the step's time by kind, and the kernel table's rows.

A call's time is its range's CPU time for a call on the CPU (a C++ kernel, an ATen op), and the time of the
GPU kernels launched inside its range for a call on a GPU. The step's time by kind: on a GPU, each kind's
GPU time, the GPU time of work outside ember's calls, and the rest of the step (the GPU idle, waiting for
the host: host gaps); on the CPU, each kind's time, the compiled graphs' time outside their calls (the
wrapper's own Python: host gaps), and the rest of the step (outside compiled graphs)."""
from __future__ import annotations

import dataclasses
from typing import Optional

from .collect import CATEGORIES, HOST, OUTSIDE

RANGE_PREFIX = "ember g"


@dataclasses.dataclass
class RangeTime:
    count: int = 0
    cpu_us: float = 0.0
    device_us: float = 0.0


@dataclasses.dataclass
class ProfileWindow:
    """What the profiler saw over `steps` steps that took `wall_s` seconds."""
    steps: int
    wall_s: float
    ranges: dict                        # range name -> RangeTime
    device_busy_us: float               # the union of the GPU's activity (0 without a GPU)
    peak_memory: Optional[int] = None   # GPU bytes allocated at most during the steps


def summarize(events, steps: int, wall_s: float, peak_memory: Optional[int] = None) -> ProfileWindow:
    """Reduce the profiler's events to the times of ember's ranges and the GPU's busy time."""
    ranges: dict = {}
    intervals = []
    for e in events:
        on_cpu = str(e.device_type).endswith("CPU")
        if on_cpu and e.name.startswith(RANGE_PREFIX):
            r = ranges.setdefault(e.name, RangeTime())
            r.count += 1
            r.cpu_us += e.cpu_time_total
            r.device_us += e.device_time_total
        elif not on_cpu and not getattr(e, "is_user_annotation", False) and not e.name.startswith(RANGE_PREFIX):
            intervals.append((e.time_range.start, e.time_range.end))
    return ProfileWindow(steps, wall_s, ranges, _union_length(intervals), peak_memory)


def _union_length(intervals) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


@dataclasses.dataclass
class KernelRow:
    """Calls of one kernel (or one extern op on the same shapes) of one graph: a row of the kernel table.
    bytes and flops are per call; the times are per step."""
    graph: int
    graph_kind: str
    label: str
    kind: str
    category: str
    backend: str
    device: str
    dtype: object
    bytes_moved: int
    flops: int
    calls_per_step: float = 0.0
    seconds_per_step: Optional[float] = None      # None: not run in the profiled steps
    groups: list = dataclasses.field(default_factory=list)
    fx_nodes: list = dataclasses.field(default_factory=list)
    source_lines: list = dataclasses.field(default_factory=list)
    reason: str = ""

    def per_call_seconds(self) -> Optional[float]:
        if not self.seconds_per_step or not self.calls_per_step:
            return None
        return self.seconds_per_step / self.calls_per_step

    def gbps(self) -> Optional[float]:
        t = self.per_call_seconds()
        return self.bytes_moved / t / 1e9 if t else None

    def tflops(self) -> Optional[float]:
        t = self.per_call_seconds()
        return self.flops / t / 1e12 if t and self.flops else None


def _on_gpu(device: str) -> bool:
    return device.startswith("cuda")


def call_seconds(call, window: Optional[ProfileWindow]) -> tuple[float, Optional[float]]:
    """(calls per step, seconds per step) of one call, from its range; (0, None) if it did not run."""
    r = window.ranges.get(call.range) if window is not None else None
    if r is None or not window.steps:
        return 0.0, None
    us = r.device_us if _on_gpu(call.device) else r.cpu_us
    return r.count / window.steps, us / 1e6 / window.steps


def kernel_rows(graphs, window: Optional[ProfileWindow]) -> list:
    """The kernel table: calls merged per (graph, kernel or op, bytes, FLOPs), slowest first."""
    rows: dict = {}
    for g in graphs:
        for c in g.calls:
            key = (g.id, c.label, c.bytes_read + c.bytes_written, c.flops)
            row = rows.get(key)
            if row is None:
                row = rows[key] = KernelRow(g.id, g.kind, c.label, c.kind, c.category, c.backend, c.device, c.dtype,
                                            c.bytes_read + c.bytes_written, c.flops, reason=c.reason)
            calls, seconds = call_seconds(c, window)
            row.calls_per_step += calls
            if seconds is not None:
                row.seconds_per_step = (row.seconds_per_step or 0.0) + seconds
            row.groups.append(c.group)
            row.fx_nodes += [n for n in c.fx_nodes if n not in row.fx_nodes]
            row.source_lines += [s for s in c.source_lines if s not in row.source_lines]
    return sorted(rows.values(), key=lambda r: (r.seconds_per_step is None, -(r.seconds_per_step or 0.0)))


def step_breakdown(graphs, window: Optional[ProfileWindow]) -> dict:
    """Seconds per step by kind (collect.CATEGORIES), summing to the step's time."""
    out = {c: 0.0 for c in CATEGORIES}
    if window is None or not window.steps:
        return out
    step = window.wall_s / window.steps
    gpu = any(_on_gpu(c.device) for g in graphs for c in g.calls)
    in_calls = 0.0
    for g in graphs:
        for c in g.calls:
            _, seconds = call_seconds(c, window)
            if seconds is not None:
                out[c.category] += seconds
                in_calls += seconds
    if gpu:
        busy = window.device_busy_us / 1e6 / window.steps
        out[OUTSIDE] = max(busy - in_calls, 0.0)
        out[HOST] = max(step - max(busy, in_calls), 0.0)
    else:
        in_graphs = sum(window.ranges[g.range].cpu_us for g in graphs if g.range in window.ranges) / 1e6 / window.steps
        out[HOST] = max(in_graphs - in_calls, 0.0)
        out[OUTSIDE] = max(step - max(in_graphs, in_calls), 0.0)
    return out
