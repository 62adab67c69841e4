"""Running a named list of FX passes, built-in then the user's (from ember.config)."""
from __future__ import annotations

from typing import Callable, Iterable

import torch.fx


def run_passes(gm: torch.fx.GraphModule, passes: Iterable[Callable], user_passes: Iterable[Callable]) -> torch.fx.GraphModule:
    for p in list(passes) + list(user_passes):
        out = p(gm)
        if isinstance(out, torch.fx.GraphModule):
            gm = out
    gm.graph.lint()
    gm.recompile()
    return gm


def dead_code_elimination(gm: torch.fx.GraphModule) -> None:
    gm.graph.eliminate_dead_code()
