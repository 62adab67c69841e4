"""In-place writes a functional graph still holds: `copy_(input, value)` writes an input back.

The graph is functional: every read of the input means its value *before* the write, however late in the
graph it comes (AOTAutograd puts the copy_ nodes last, and any later use of the new value reads the
copy_'s result, not the input). So a write is only recorded here and stored into the input after every
other value of the graph (GraphLowering.flush_mutations, at the output): values still to be computed that
read the input then read the old contents, as they must.
"""
from __future__ import annotations

import sympy
import torch

from .. import state
from ..ir.deps import record_loops
from ..ir.nodes import Buffer, Loops, MutationBuffer, Pointwise, TensorBox, loops_of_realized
from ..ir.symbolic import make_index_vars
from .pointwise import broadcast_loader, cast, scalar_value
from .registry import Unsupported, lower

aten = torch.ops.aten


@lower(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    if not isinstance(dst.data, Buffer) or dst.data.layout is None:
        raise Unsupported("copy_ into something that is not a whole buffer")
    if isinstance(src, TensorBox) and src.device != dst.device:
        raise Unsupported("copy_ across devices")
    if isinstance(src, TensorBox) and src.data is dst.data:
        return dst     # the value was computed in the input's own memory (lowering/scatter.py, scatter_target)
    size = dst.get_size()
    if isinstance(src, TensorBox):
        load, sdt = broadcast_loader(src, size), src.dtype
    else:
        load, sdt = (lambda idx: scalar_value(src, dst.dtype)), dst.dtype
    ddt = dst.dtype
    new = TensorBox(Pointwise(dst.device, ddt, lambda idx: cast(load(idx), sdt, ddt), list(size)))
    state.current_graph().pending_mutations.append((dst.data, new))
    return new     # the input's value after the write, for any later use of copy_'s result


@lower(aten.copy.default)
def copy(dst, src, non_blocking=False):
    """The functional copy: src broadcast to dst's size, in dst's dtype (dst's values are not read)."""
    if isinstance(src, TensorBox) and src.device != dst.device:
        raise Unsupported("copy across devices")
    size = dst.get_size()
    if not isinstance(src, TensorBox):
        raise Unsupported("copy from a scalar")
    load, sdt, ddt = broadcast_loader(src, size), src.dtype, dst.dtype
    return TensorBox(Pointwise(dst.device, ddt, lambda idx: cast(load(idx), sdt, ddt), list(size)))


def flush_mutations(graph) -> None:
    """Store the recorded writes into their inputs, after everything else the graph computes."""
    pending, graph.pending_mutations = graph.pending_mutations, []
    targets = {target.storage_name() for target, _ in pending}
    # a write whose value reads a written input anywhere but at the very element it writes (another
    # input, or a permuted/shifted read of its own) must be computed in full before any write lands
    for target, value in pending:
        if not isinstance(value.data, Loops):
            continue
        own, layout = target.storage_name(), target.layout
        h = record_loops(value.data.inner_fn, value.data.ranges)
        index = sympy.expand(layout.index(make_index_vars("i", len(value.data.ranges))) - layout.offset)
        for dep in h.reads:
            if dep.name in targets and (dep.name != own or sympy.expand(dep.index) != index):
                value.realize()
                break
    for target, value in pending:
        data = value.data
        if not isinstance(data, Loops):
            data = loops_of_realized(data)
        graph.register_buffer(MutationBuffer(None, target, data))
