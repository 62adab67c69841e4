"""The split of a joint forward+backward graph into the forward and the backward: ember's joint passes, then
AOTAutograd's min-cut partitioner under ember's policy for what the backward recomputes.

torch's partitioner never recomputes a value the backward "materializes" (reads through an op that no
kernel fuses, a matrix product above all): recomputing it means writing it again. ember lifts that ban
(config.recompute_product_operands), so the min-cut may save a value's inputs instead of the value where
that holds fewer bytes. In a transformer's training step the values it then recomputes are the
normalizations' outputs (from the saved residual and the row statistics) and the MLP's activation
(`silu(gate) * up` from the saved gate and up, GELU's output from its saved input): each is read by the
backward's weight-gradient product, and its inputs are saved for the backward of the same op anyway. The
backward's kernel for that op reads those inputs already and writes the recomputed value beside its own
results, so recomputing costs one write where saving cost a write in the forward and the bytes held
between the two halves.

The low-precision copies of parameters that autocast makes would be recomputed too (a parameter is free
to save: it outlives the step). That reads every fp32 weight again in the backward for a saving of a
quarter of the weights' bytes, so with config.save_weight_casts they stay saved, as torch saves them.
"""
from __future__ import annotations

import torch
import torch.fx
from torch._functorch import config as functorch_config
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy

from ... import config
from . import joint
from .cse import eliminate_common_subexpressions
from .saved_precision import cast_dtype


def mark_weight_casts_saved(gm: torch.fx.GraphModule, static_input_indices) -> None:
    """Mark each dtype conversion of a parameter (a static-lifetime primal) for saving, as torch's
    checkpoint policies mark a value (`CheckpointPolicy.MUST_SAVE`)."""
    primals = [n for n in gm.graph.find_nodes(op="placeholder") if "tangents" not in str(n.target)]
    params = [primals[i] for i in static_input_indices or () if i < len(primals)]
    for user in (u for p in params for u in p.users):
        if cast_dtype(user) is not None and "recompute" not in user.meta:
            user.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def partition(joint_gm: torch.fx.GraphModule, joint_inputs, **kwargs):
    """AOTAutograd's `partition_fn`: (forward module, backward module). With recompute_product_operands
    off, torch's own partitioner settings decide."""
    joint_gm = joint.run(joint_gm)
    settings = {}
    if functorch_config.cse:
        # torch's own pass would import inductor's pattern matcher and lowerings (graph/passes/cse.py)
        eliminate_common_subexpressions(joint_gm)
        settings["cse"] = False
    lift = config.recompute_product_operands
    if lift:
        settings["ban_recompute_materialized_backward"] = False
        if config.save_weight_casts:
            mark_weight_casts_saved(joint_gm, kwargs.get("static_lifetime_input_indices"))
    with functorch_config.patch(**settings):
        return min_cut_rematerialization_partition(joint_gm, joint_inputs, **kwargs)
