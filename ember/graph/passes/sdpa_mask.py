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


# -- masks computed from constants ----------------------------------------------------------------------------
# A model called without a padding mask often builds one of ones inside the graph (Hugging Face's BERT does,
# when `attention_mask` is None) and hands SDPA a mask that keeps every key. Eager Hugging Face drops such a
# mask before the call; a compiled graph cannot look at the values, so it calls SDPA with a mask, which
# rules out the flash kernel and reads the mask in every attention tile. When the mask depends on no input
# of the graph, its value is known at compile time: this pass computes it, and a mask that keeps everything
# (all True, or an additive mask of zeros) is dropped from the call.

_MAX_FOLDED_ELEMENTS = 1 << 26


_RANDOM_WORDS = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson", "exponential",
                 "geometric", "cauchy", "seed")


def _random_or_in_place(n: torch.fx.Node) -> bool:
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return any(w in name.lower() for w in _RANDOM_WORDS) or name.endswith("_") and not name.endswith("__")


def _constant_ancestors(mask: torch.fx.Node):
    """The nodes `mask` is computed from, in graph order, if none of them is an input of the graph (nor a
    module attribute, which a program may update in place), random or in place, used by any other node than
    these and SDPA calls, and every size is static; else None."""
    seen, stack = {}, [mask]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op not in ("call_function", "call_method") or _random_or_in_place(n):
            return None
        val = n.meta.get("example_value")
        for v in (val if isinstance(val, (tuple, list)) else [val]):
            if isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and \
                    not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
                return None
        seen[n] = True
        stack.extend(n.all_input_nodes)
    # a value another node uses may be written through that node (`keep[:, -1] = 0`, a view filled in
    # place): only nodes whose every user is known are folded
    for n in seen:
        if any(u not in seen and not (u.op == "call_function" and u.target in _SDPA) for u in n.users):
            return None
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _keeps_everything(mask: torch.fx.Node) -> bool:
    nodes = _constant_ancestors(mask)
    val = mask.meta.get("example_value")
    if nodes is None or not isinstance(val, torch.Tensor) or val.numel() > _MAX_FOLDED_ELEMENTS:
        return False
    g = torch.fx.Graph()
    env: dict = {}
    for n in nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(env[mask])
    try:
        with torch.no_grad():
            value = torch.fx.GraphModule(torch.nn.Module(), g)()
    except Exception:          # noqa: BLE001 - a mask ember cannot compute here is kept as it is
        return False
    if not isinstance(value, torch.Tensor):
        return False
    return bool(value.all()) if value.dtype == torch.bool else bool((value == 0).all())


def drop_masks_that_keep_everything(gm: torch.fx.GraphModule) -> None:
    dropped = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        where = _mask_arg(node)
        if where is None or not isinstance(where[1], torch.fx.Node) or not _keeps_everything(where[1]):
            continue
        key = where[0]
        if key == 3:
            node.args = node.args[:3] + (None,) + node.args[4:]
        else:
            node.kwargs = {**node.kwargs, "attn_mask": None}
        metrics.sdpa_masks_dropped += 1
        dropped = True
    if dropped:
        gm.graph.eliminate_dead_code()
