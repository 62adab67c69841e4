"""Passes on Dynamo's torch-level graph, before AOTAutograd. Aliasing and mutation are still present at
this level, so passes here must be conservative. What runs here must run before AOTAutograd traces:
SDPA's choice of kernel happens during that trace."""
from __future__ import annotations

import torch.fx

from ... import config
from .common import run_passes
from .integer_resize import keep_integer_resizes_exact
from .linear_cross_entropy import fuse_linear_cross_entropy
from .sdpa_mask import contiguous_sdpa_masks, drop_masks_that_keep_everything

PASSES: list = [fuse_linear_cross_entropy, drop_masks_that_keep_everything, contiguous_sdpa_masks,
                keep_integer_resizes_exact]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.pre_grad_passes)
