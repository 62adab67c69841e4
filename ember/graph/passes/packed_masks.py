"""Joint-graph pass: a dropout mask kept for the backward is kept as bits, eight elements to a byte.

A training step's dropout (`aten.native_dropout`) returns its output and its mask, one bool byte per
element, and the backward multiplies the incoming gradient by that mask. Nothing can recompute the mask (it
comes from the random generator), so the partition keeps it between the two halves: for GPT-2 at 8 x 1024
tokens, 25 masks of 8192 x 768 bytes, 0.15 GiB at the step's peak. Here the forward packs the mask where it
is made (a reduction of each 8 elements to one uint8: `sum(bit << position)`) and the backward unpacks it
where it reads it (`(packed >> position) & 1`, which the backward's kernel reads in place of the bool);
the partition then keeps the packed bytes, an eighth of the mask. The values are the same bits, so every
gradient is the one the bool mask gives.

Masks of fewer than MIN_PACKED_ELEMENTS elements, of a number of elements not a multiple of eight, or not
contiguous keep their bytes; `config.packed_dropout_masks` (EMBER_PACKED_DROPOUT_MASKS=0) turns the pass off.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ... import config
from .common import call_op, depends_on_tangents, forward_nodes

aten = torch.ops.aten

# Below this, the bytes saved (7/8 of one per element) are fewer than what the extra ops cost to launch
MIN_PACKED_ELEMENTS = 1 << 16
BITS = 8


def _mask_of(dropout: torch.fx.Node):
    """native_dropout's second result, the bool mask, if the graph reads it."""
    return next((u for u in dropout.users if u.target is operator.getitem and u.args[1] == 1), None)


def _packable(mask: torch.fx.Node) -> bool:
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bool:
        return False
    n = val.numel()
    return isinstance(n, int) and n >= MIN_PACKED_ELEMENTS and n % BITS == 0 and val.is_contiguous()


def _arange(graph: torch.fx.Graph, like: torch.fx.Node) -> torch.fx.Node:
    """A uint8 [0, 1, .., 7] node on `like`'s device."""
    node = graph.call_function(aten.arange.start_step, (0, BITS, 1),
                               {"dtype": torch.uint8, "device": like.meta["val"].device})
    with like.meta["val"].fake_mode:
        node.meta["val"] = torch.arange(0, BITS, 1, dtype=torch.uint8, device=like.meta["val"].device)
    return node


def _pack(graph: torch.fx.Graph, mask: torch.fx.Node) -> torch.fx.Node:
    bits = call_op(graph, aten._to_copy.default,
                   call_op(graph, aten.view.default, mask, [-1, BITS]), dtype=torch.uint8)
    shifted = call_op(graph, aten.bitwise_left_shift.Tensor, bits, _arange(graph, mask))
    return call_op(graph, aten.sum.dim_IntList, shifted, [1], dtype=torch.uint8)


def _unpack(graph: torch.fx.Graph, packed: torch.fx.Node, shape) -> torch.fx.Node:
    column = call_op(graph, aten.unsqueeze.default, packed, 1)
    shifted = call_op(graph, aten.bitwise_right_shift.Tensor, column, _arange(graph, packed))
    bit = call_op(graph, aten.bitwise_and.Scalar, shifted, 1)
    flag = call_op(graph, aten._to_copy.default, bit, dtype=torch.bool)
    return call_op(graph, aten.view.default, flag, list(shape))


def pack_dropout_masks(gm: torch.fx.GraphModule) -> None:
    if not config.packed_dropout_masks:
        return
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    forward = None
    order = {n: i for i, n in enumerate(graph.nodes)}
    for dropout in list(graph.find_nodes(op="call_function", target=aten.native_dropout.default)):
        mask = _mask_of(dropout)
        if mask is None or not _packable(mask):
            continue
        if forward is None:
            forward = forward_nodes(gm, output, depends_on_tangents(gm))
        # the readers only the backward needs (the cast of the mask that scales the incoming gradient)
        reading = [u for u in mask.users if u not in forward]
        if not reading:
            continue
        with graph.inserting_before(mask.next):
            packed = _pack(graph, mask)
        with graph.inserting_before(min(reading, key=order.__getitem__)):
            unpacked = _unpack(graph, packed, mask.meta["val"].shape)
        for user in reading:
            user.replace_input_with(mask, unpacked)
    if forward is not None:
        gm.recompile()
