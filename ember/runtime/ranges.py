"""config.report: the profiler ranges the wrapper opens around each device call and each graph call.
torch's fast record-function object costs well under a microsecond whether or not a profiler is running,
and nothing is emitted without config.report."""
from __future__ import annotations

import torch

profile_range = torch._C._profiler._RecordFunctionFast     # `with profile_range(name): ...`


def open_range(name: str):
    """The FX wrapper's way in: a range object, entered (close it with close_range)."""
    r = profile_range(name)
    r.__enter__()
    return r


def close_range(r) -> None:
    r.__exit__(None, None, None)
