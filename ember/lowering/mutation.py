"""In-place writes a functional graph still holds: `copy_(input, value)` writes an input back."""
from __future__ import annotations

import torch

from .. import state
from ..ir.nodes import Buffer, MutationBuffer, Pointwise, ReinterpretView, TensorBox
from .pointwise import broadcast_loader, cast
from .registry import Unsupported, lower

aten = torch.ops.aten


@lower(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    if not isinstance(dst.data, Buffer) or dst.data.layout is None:
        raise Unsupported("copy_ into something that is not a whole buffer")
    if isinstance(src, TensorBox) and src.device != dst.device:
        raise Unsupported("copy_ across devices")
    size = dst.get_size()
    load = broadcast_loader(src, size)
    sdt, ddt = src.dtype, dst.dtype
    data = Pointwise(dst.device, ddt, lambda idx: cast(load(idx), sdt, ddt), list(size))
    state.current_graph().register_buffer(MutationBuffer(None, dst.data, data))
    return dst
