"""Passes on AOTAutograd's joint forward+backward graph, before it is partitioned."""
from __future__ import annotations

import torch.fx

from ... import config
from .attention import fuse_attention_joint
from .common import dead_code_elimination, run_passes
from .packed_masks import pack_dropout_masks
from .saved_precision import widen_saved_values

PASSES: list = [fuse_attention_joint, widen_saved_values, pack_dropout_masks, dead_code_elimination]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.joint_passes)
