"""The torch.compile entry: Dynamo graph -> pre-grad passes -> AOTAutograd (joint passes, min-cut
partition) -> compile_graph for the forward, backward or inference graph."""
from __future__ import annotations

import functools

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from . import config
from .compile_graph import compile_graph
from .graph.decompose import decomposition_table
from .graph.passes import joint, pre_grad


def _partition(joint_gm, joint_inputs, **kwargs):
    joint_gm = joint.run(joint_gm)
    return min_cut_rematerialization_partition(joint_gm, joint_inputs, **kwargs)


def ember_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """`torch.compile(model, backend="ember")`."""
    config.validate()
    gm = pre_grad.run(gm)
    compiler = aot_autograd(
        fw_compiler=functools.partial(compile_graph, is_backward=False),
        bw_compiler=functools.partial(compile_graph, is_backward=True),
        inference_compiler=functools.partial(compile_graph, is_inference=True),
        partition_fn=_partition,
        decompositions=decomposition_table(),
        keep_inference_input_mutations=True,
    )
    return compiler(gm, example_inputs)


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "ember" not in _BACKENDS or _BACKENDS.get("ember") is None:
        register_backend(name="ember")(ember_backend)
