"""Keep linear, bilinear, bicubic and trilinear resizes of integer images exact.

AOTAutograd's trace replaces `F.interpolate` by torch's Python decomposition of the upsampling op, which
computes in float32 and rounds. Eager's uint8 kernels use fixed-point weights instead, and the two differ
by one in 16% of a bilinear 270 -> 130 resize's pixels (so do inductor's and aot_eager's graphs). This pass
runs before that trace: an `interpolate` (or a deprecated `upsample*`) of an integer tensor in one of those
modes becomes `ember::integer_resize` (graph/custom_ops.py), which the trace keeps as one op and ember runs
as eager's kernel. Float images keep the decomposition, which ember fuses.
"""
from __future__ import annotations

import torch
import torch.fx

from ..custom_ops import integer_resize

F = torch.nn.functional
_MODES = ("linear", "bilinear", "bicubic", "trilinear")
# each resizing function's parameters after the input, and what it fixes (the deprecated upsample_bilinear
# is interpolate with bilinear mode and corners aligned)
_FUNCTIONS = {
    F.interpolate: (("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias"), {}),
    F.upsample: (("size", "scale_factor", "mode", "align_corners"), {}),
    F.upsample_bilinear: (("size", "scale_factor"), {"mode": "bilinear", "align_corners": True}),
}


def _as_list(v, dims: int, kind):
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [kind(e) for e in v]
    return [kind(v)] * dims


def _call(node: torch.fx.Node) -> dict:
    """The resize's arguments by name, as interpolate takes them, or {} where one is not a plain constant (a
    graph value, a size Dynamo made symbolic): those calls are left alone."""
    params, fixed = _FUNCTIONS[node.target]
    args = dict(zip(params, node.args[1:]), **node.kwargs, **fixed)
    flat = [e for v in args.values() for e in (v if isinstance(v, (list, tuple)) else [v])]
    if any(not isinstance(e, (int, float, str, bool, type(None))) for e in flat):
        return {}
    return args


def keep_integer_resizes_exact(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _FUNCTIONS or not node.args:
            continue
        x = node.args[0].meta.get("example_value") if isinstance(node.args[0], torch.fx.Node) else None
        args = _call(node)
        if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.is_complex() or \
                args.get("mode") not in _MODES or args.get("recompute_scale_factor"):
            continue
        dims = x.dim() - 2
        with gm.graph.inserting_before(node):
            exact = gm.graph.call_function(integer_resize, (
                node.args[0], _as_list(args.get("size"), dims, int), _as_list(args.get("scale_factor"), dims, float),
                args["mode"], args.get("align_corners"), bool(args.get("antialias", False))))
        exact.meta = dict(node.meta)
        node.replace_all_uses_with(exact)
        gm.graph.erase_node(node)
