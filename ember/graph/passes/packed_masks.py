"""Joint-graph pass: a dropout mask kept for the backward is drawn and kept as bits, eight elements to a byte.

A training step's dropout (`aten.native_dropout`) returns its output and its mask, one bool byte per
element, and the backward multiplies the incoming gradient by that mask. Nothing can recompute the mask (it
comes from the random generator), so the partition keeps it between the two halves: for GPT-2 at 8 x 1024
tokens, 25 masks of 8192 x 768 bytes, 0.15 GiB at the step's peak. Here the forward draws the keep flags
as bits, eight elements to a byte (`ember::dropout_bits`, whose kernel makes two Philox draws per byte
where a dropout makes one per element), computes the dropout's output from them (`x * flag * scale`,
unpacking `(bits >> position) & 1` where its kernel reads the flag), and the backward unpacks them where
it reads them; the dropout's own draw is gone, and the partition keeps the packed bytes, an eighth of the
mask. The forward's output and the backward's gradient read the same bits.

Masks of fewer than MIN_PACKED_ELEMENTS elements, of a number of elements not a multiple of eight, or not
contiguous keep their bytes; `config.packed_dropout_masks` (EMBER_PACKED_DROPOUT_MASKS=0) turns the pass off.

A dropout inside a checkpointed region (torch.utils.checkpoint: its nodes carry a recompute policy) would be
replayed in the backward: torch's partitioner then wraps it in run_and_save_rng_state / run_with_rng_state
(on a GPU graphsafe_run_with_rng_state, with generators passed as graph inputs), which run as ATen calls,
outside ember's kernels. Instead its mask is kept (as bits whatever its size, where its
elements are a multiple of eight and contiguous; else as bools) and the region's output is
`x * mask * scale` recomputed from the kept mask: the backward replays the region without drawing again,
with the very mask the forward drew, as eager's checkpoint does by restoring the generator's state. The
region's other random ops of one result (stochastic depth's `bernoulli` keep flags) are saved the same way.
"""
from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy

from ... import config
from .common import call_op, depends_on_tangents, forward_nodes
from ..custom_ops import dropout_bits
from .cse import KEEP_APART

aten = torch.ops.aten

# Below this, the bytes saved (7/8 of one per element) are fewer than what the extra ops cost to launch
MIN_PACKED_ELEMENTS = 1 << 16
BITS = 8


def _result(dropout: torch.fx.Node, i: int):
    """native_dropout's result i (0: the output, 1: the bool mask), if the graph reads it."""
    return next((u for u in dropout.users if u.target is operator.getitem and u.args[1] == i), None)


def _mask_first(dropout: torch.fx.Node) -> Optional[torch.fx.Node]:
    """native_dropout's mask getitem, moved to right after the dropout: what is computed from the mask and
    inserted after it then comes before every reader of the dropout's output."""
    mask = _result(dropout, 1)
    if mask is not None:
        dropout.append(mask)
    return mask


def _packable(mask: torch.fx.Node, min_elements: Optional[int] = None) -> bool:
    val = mask.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bool:
        return False
    n = val.numel()
    least = MIN_PACKED_ELEMENTS if min_elements is None else min_elements
    return isinstance(n, int) and n >= least and n % BITS == 0 and val.is_contiguous()


def _checkpointed(node: torch.fx.Node) -> bool:
    return node.meta.get("recompute") in (CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.MUST_RECOMPUTE)


def _arange(graph: torch.fx.Graph, like: torch.fx.Node) -> torch.fx.Node:
    """A uint8 [0, 1, .., 7] node on `like`'s device."""
    node = graph.call_function(aten.arange.start_step, (0, BITS, 1),
                               {"dtype": torch.uint8, "device": like.meta["val"].device})
    with like.meta["val"].fake_mode:
        node.meta["val"] = torch.arange(0, BITS, 1, dtype=torch.uint8, device=like.meta["val"].device)
    return node


def _draw_bits(graph: torch.fx.Graph, dropout: torch.fx.Node, mask: torch.fx.Node) -> torch.fx.Node:
    """The dropout's keep flags drawn as bits, eight to a byte (ember::dropout_bits): the draw that replaces
    the dropout's own, whose outputs are then all computed from these bits."""
    val = mask.meta["val"]
    node = graph.call_function(dropout_bits, (val.numel() // BITS, dropout.args[1], val.device))
    with val.fake_mode:
        node.meta["val"] = dropout_bits(val.numel() // BITS, dropout.args[1], val.device)
    return node


def _erase(dropout: torch.fx.Node, *results) -> None:
    """The dropout and its results, read by nothing now: its draw is the bits' (a random op left in the
    graph would still draw, and dead-code elimination keeps random ops outside a trace)."""
    graph = dropout.graph
    for r in results:
        if r is not None and not r.users:
            graph.erase_node(r)
    if not dropout.users:
        graph.erase_node(dropout)


def _unpack(graph: torch.fx.Graph, packed: torch.fx.Node, shape) -> torch.fx.Node:
    column = call_op(graph, aten.unsqueeze.default, packed, 1)
    shifted = call_op(graph, aten.bitwise_right_shift.Tensor, column, _arange(graph, packed))
    bit = call_op(graph, aten.bitwise_and.Scalar, shifted, 1)
    flag = call_op(graph, aten._to_copy.default, bit, dtype=torch.bool)
    return call_op(graph, aten.view.default, flag, list(shape))


def _masked(graph: torch.fx.Graph, x: torch.fx.Node, flag: torch.fx.Node, p: float) -> torch.fx.Node:
    """native_dropout's output from its mask: x * mask * 1/(1-p), in x's dtype."""
    dtype = x.meta["val"].dtype
    return call_op(graph, aten.mul.Tensor,
                   call_op(graph, aten.mul.Tensor, x, call_op(graph, aten._to_copy.default, flag, dtype=dtype)),
                   1.0 / (1.0 - p))


def _keep_apart(first: torch.fx.Node, end: torch.fx.Node) -> None:
    """The forward's unpacking (nodes first up to end) is not merged with the backward's equal nodes: merged,
    it would be a forward value the backward reads, and the partition would save those unpacked bytes
    (torch's partitioner does not recompute bitwise ops) instead of the packed ones."""
    n = first
    while n is not end:
        n.meta[KEEP_APART] = True
        n = n.next


def _draws(dropout: torch.fx.Node) -> bool:
    """A training dropout of a constant probability strictly between 0 and 1 (its output is x * mask * scale)."""
    p = dropout.args[1]
    return isinstance(p, float) and 0 < p < 1 and (len(dropout.args) < 3 or dropout.args[2] is not False)


def _keep_checkpointed_mask(graph: torch.fx.Graph, dropout: torch.fx.Node) -> None:
    """A checkpointed region's dropout: its mask kept (packed where it can be), its output recomputed from
    the kept mask, so the backward's replay of the region draws nothing."""
    x, p = dropout.args[0], dropout.args[1]
    out = _result(dropout, 0)
    mask = _mask_first(dropout)
    if mask is None:
        with graph.inserting_before(dropout.next):
            mask = graph.call_function(operator.getitem, (dropout, 1))
        mask.meta.update(dropout.meta, val=dropout.meta["val"][1])
    tags = {k: dropout.meta[k] for k in ("recompute", "ac_graph_id") if k in dropout.meta}
    readers = list(mask.users)
    after = mask.next
    with graph.inserting_before(after):
        packable = _packable(mask, min_elements=BITS)
        # unpacked, a copy: the partitioner does not honour a policy on the getitem of a random op
        kept = _draw_bits(graph, dropout, mask) if packable else call_op(graph, aten.clone.default, mask)
        flag = _unpack(graph, kept, mask.meta["val"].shape) if packable else kept
        recomputed = _masked(graph, x, flag, p)
    n = kept.next
    while n is not after:               # the unpacking and the output: recomputed with the region
        n.meta.update(tags)
        n = n.next
    kept.meta.update(tags, recompute=CheckpointPolicy.MUST_SAVE)
    for user in readers:
        user.replace_input_with(mask, flag)
    if out is not None:
        out.replace_all_uses_with(recomputed)
    if packable:
        _erase(dropout, out, mask)


def _keep_checkpointed_draws(graph: torch.fx.Graph) -> None:
    """A checkpointed region's other random ops of one result (bernoulli, rand_like: stochastic depth's
    per-sample keep flags) are saved, not replayed in the backward."""
    for n in graph.nodes:
        if n.op == "call_function" and _checkpointed(n) and n.target is not aten.native_dropout.default \
                and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) \
                and isinstance(n.meta.get("val"), torch.Tensor):
            n.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def pack_dropout_masks(gm: torch.fx.GraphModule) -> None:
    """The pass, on a joint graph (joint.PASSES, whose runner recompiles the module once after them all)."""
    if not config.packed_dropout_masks:
        return
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    forward = None
    order = {n: i for i, n in enumerate(graph.nodes)}
    _keep_checkpointed_draws(graph)
    for dropout in list(graph.find_nodes(op="call_function", target=aten.native_dropout.default)):
        if not _draws(dropout):
            continue
        if _checkpointed(dropout):
            _keep_checkpointed_mask(graph, dropout)
            continue
        mask = _mask_first(dropout)
        if mask is None or not _packable(mask):
            continue
        if forward is None:
            forward = forward_nodes(gm, output, depends_on_tangents(gm))
        # the readers only the backward needs (the cast of the mask that scales the incoming gradient)
        reading = [u for u in mask.users if u not in forward]
        if not reading:
            continue
        after, shape = mask.next, mask.meta["val"].shape
        out = _result(dropout, 0)
        with graph.inserting_before(after):
            packed = _draw_bits(graph, dropout, mask)
            # the forward's output and readers, too, from the packed bits: the dropout's own draw goes, and
            # the output's kernel reads a bit per element where it would draw a random number
            flag = _unpack(graph, packed, shape)
            masked = _masked(graph, dropout.args[0], flag, dropout.args[1]) if out is not None else None
        _keep_apart(packed.next, after)
        if out is not None:
            out.replace_all_uses_with(masked)
        for user in [u for u in mask.users if u not in reading]:
            user.replace_input_with(mask, flag)
        with graph.inserting_before(min(reading, key=order.__getitem__)):
            unpacked = _unpack(graph, packed, shape)
        for user in reading:
            user.replace_input_with(mask, unpacked)
        _erase(dropout, out, mask)
