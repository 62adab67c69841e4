"""Ranks agree on a compile's outcome. A graph with collectives is compiled by every rank of its process
groups; if ember compiles it on some ranks and runs it eagerly on others, the ranks issue different
collectives (ember buckets them, for one) and wait for each other forever or exchange wrong data. So when
torch.distributed is initialized, each rank compiling a graph with collectives reports whether it succeeded,
and the ranks take the minimum over each of the graph's groups (in their names' order: the same sequence of
collectives on every rank): one failure anywhere makes every rank run the graph eagerly, the graph as
given to ember, before any pass changed it.
"""
from __future__ import annotations

import torch
import torch.fx


def collective_groups(gm: torch.fx.GraphModule) -> list:
    """The names of the process groups `gm`'s collectives run on, sorted; [] when torch.distributed is not
    initialized (no other rank to agree with)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return []
    from ..lowering.collectives import group_name
    names = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "_c10d_functional" and \
                "group_name" in [a.name for a in n.target._schema.arguments]:
            names.add(str(group_name(n.target, n.args, n.kwargs)))
    return sorted(names)


def graph_as_given(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule of `gm`'s graph as it is now, sharing its parameters and buffers (ember's passes
    change `gm`'s graph in place)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def all_succeeded(succeeded: bool, groups: list) -> bool:
    """Whether every rank of `groups` succeeded (this rank's outcome: `succeeded`). Collective: every rank
    of each group must call it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    dist = torch.distributed
    from torch.distributed.distributed_c10d import _resolve_process_group
    with unset_fake_temporarily():
        for name in groups:
            group = _resolve_process_group(name)
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
                else torch.device("cpu")
            flag = torch.tensor([int(succeeded)], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
            succeeded = bool(flag.item())
    return succeeded
