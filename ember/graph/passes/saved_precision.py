"""Joint-graph pass: the backward reads a forward value at the precision the forward computed it in.

Core ATen's batch-norm decomposition computes its statistics in float32 and, on the CPU, returns the saved
mean and inverse standard deviation in the input's dtype, as eager's CPU kernel does; its backward
decomposition widens them to float32 again. In a bf16 or fp16 training graph that is the chain

    stat_f32 --(forward)--> round to bf16 --(backward)--> widen to f32 --> every gradient

and the rounding costs the backward 8 (bf16) or 11 (fp16) bits of the mean exactly where they matter: the
gradients use `x - mean`, so the mean's rounding error is measured against the standard deviation, not the
mean. With inputs whose mean is large against their spread (`randn * 0.5 + 8`), the bf16 weight gradient
is some ten times further from a float32 reference than the output is, in eager as in a graph that keeps
the chain.

The pass gives each widening of such a chain the float32 value itself. It applies to a cast only where
  - the narrowed value `y = cast(x, narrow)` is used by nothing but casts back to `x`'s dtype, so no op reads
    it at the narrow precision, and it is no graph output;
  - `x` is a forward value (it depends on no tangent) and those widening casts are backward-only (no
    forward output or side effect depends on them): the rounding only stores `x` between the two halves. A cast whose widened value the forward reads
    (`x.bfloat16().float()` written in a model) is the program's own rounding and stays.
The backward then needs `x`: the partitioner saves it in the wide dtype (for normalization statistics, one
value per channel or row) or recomputes it.
"""
from __future__ import annotations

import torch
import torch.fx

from .common import depends_on_tangents, forward_nodes

aten, prims = torch.ops.aten, torch.ops.prims

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cast_dtype(node: torch.fx.Node):
    """The dtype a pure dtype conversion `node` converts its first argument to, else None: a `_to_copy`
    that changes nothing but the dtype, or `prims.convert_element_type`."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    src, val = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
        return None
    if node.target is prims.convert_element_type.default:
        return val.dtype
    if node.target is not aten._to_copy.default or len(node.args) != 1:
        return None
    same = {"dtype": val.dtype, "device": src.device, "layout": src.layout, "memory_format": None,
            "non_blocking": False}
    if any(k not in same or (v is not None and v != same[k]) for k, v in node.kwargs.items()):
        return None
    return node.kwargs.get("dtype")


def widen_saved_values(gm: torch.fx.GraphModule) -> None:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    forward = None
    for narrow in list(gm.graph.nodes):
        dtype = cast_dtype(narrow)
        if dtype not in FLOATS or narrow in output.all_input_nodes:
            continue
        wide = narrow.args[0]
        wide_dtype = wide.meta["val"].dtype
        if wide_dtype not in FLOATS or dtype.itemsize >= wide_dtype.itemsize:
            continue
        users = list(narrow.users)
        if not users or any(cast_dtype(u) != wide_dtype for u in users):
            continue
        if forward is None:
            backward = depends_on_tangents(gm)
            forward = forward_nodes(gm, output, backward)
        if wide in backward or any(u in forward for u in users):
            continue
        for u in users:
            u.replace_all_uses_with(wide)
            gm.graph.erase_node(u)
        gm.graph.erase_node(narrow)
