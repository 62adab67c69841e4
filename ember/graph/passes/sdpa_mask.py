"""Give scaled_dot_product_attention's mask a layout its fused kernels accept.

SDPA picks its kernel (flash, memory-efficient, cuDNN, or the math form: matmuls and a softmax) from its
inputs, and on CUDA the fused kernels need the mask's last dimension to be contiguous. A mask broadcast
along the key dimension (stride 0 there) sends it to the math form. Hugging Face's masks take that layout
under torch.compile: BERT's padding mask reaches SDPA as a bool `[batch, 1, query, key]` view with strides
`(0, query, 1, 0)`. Eager never sees it (Hugging Face drops a mask of all ones outside torch.compile),
so the compiled model ran attention as matmuls and softmax where eager ran one fused kernel.

This pass makes such a mask contiguous before the call. AOTAutograd then traces SDPA with a mask that a
fused kernel accepts, and the graph ember receives calls that kernel forward and backward. The copy is
one mask-sized tensor (a bool `[batch, 1, query, key]`: 1 MiB for 4x512x512), written once per call.
"""
from __future__ import annotations

import torch
import torch.fx

from ... import metrics

_SDPA = (torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)


def _mask_arg(node: torch.fx.Node):
    """(where the mask is passed: positional index or keyword, the mask node) or None."""
    if len(node.args) > 3:
        return 3, node.args[3]
    if "attn_mask" in node.kwargs:
        return "attn_mask", node.kwargs["attn_mask"]
    return None


def _needs_layout(mask: torch.Tensor) -> bool:
    return mask.dim() >= 1 and mask.size(-1) > 1 and mask.stride(-1) != 1


def contiguous_sdpa_masks(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        where = _mask_arg(node)
        if where is None or not isinstance(where[1], torch.fx.Node):
            continue
        key, mask = where
        val = mask.meta.get("example_value")
        if not isinstance(val, torch.Tensor) or not _needs_layout(val):
            continue
        with gm.graph.inserting_before(node):
            dense = gm.graph.call_method("contiguous", (mask,))
        dense.meta["example_value"] = val.contiguous() if not isinstance(val, torch._subclasses.FakeTensor) \
            else _fake_contiguous(val)
        if key == 3:
            node.args = node.args[:3] + (dense,) + node.args[4:]
        else:
            node.kwargs = {**node.kwargs, "attn_mask": dense}
        metrics.sdpa_mask_copies += 1


def _fake_contiguous(val: torch.Tensor) -> torch.Tensor:
    with val.fake_mode:
        return val.contiguous()
