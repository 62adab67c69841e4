"""Passes on Dynamo's torch-level graph, before AOTAutograd. Aliasing and mutation are still present at
this level, so passes here must be conservative."""
from __future__ import annotations

import torch.fx

from ... import config
from .common import run_passes
from .linear_cross_entropy import fuse_linear_cross_entropy

PASSES: list = [fuse_linear_cross_entropy]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.pre_grad_passes)
