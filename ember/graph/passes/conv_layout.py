"""Layout planning for convolutions: where a graph's 2-D convolutions run channels-last (NHWC), every
convolution reads its activation and weight channels-last and writes channels-last, and so do the
values between convolutions, so that the kernels around a convolution store and load NHWC and the
convolution library converts nothing.

The plan is a post-grad pass on the fake values (`meta["val"]`) lowering stores values by:

1. Before each 2-D `convolution` (operands 0, 1) and `convolution_backward` (operands 0, 1, 2), an
   operand that is not channels-last is read through `clone(memory_format=channels_last)`. The clone is
   an ember pointwise: where the operand is computed by ember (BatchNorm, ReLU, a residual add), its
   kernel stores it NHWC directly; a graph input (the image, a weight) is copied once per call.
2. The fake values downstream are recomputed with the new layouts, as eager would give them for
   channels-last operands (a convolution of channels-last tensors is channels-last, a pointwise op keeps
   its input's layout), so every value between convolutions is stored NHWC. An op whose fake run fails
   on the new layouts (a `view` that needs the traced strides) or whose result depends on strides
   (`as_strided`) reads its inputs converted back to their traced layouts instead.
3. The graph's outputs get the traced (eager's) strides back, through a copy where the plan changed them,
   except the activations a forward graph saves for its backward: those stay channels-last. The forward
   reports its outputs' strides to AOTAutograd (`TracingContext.output_strides`), which hands the backward
   compiler example inputs with them; `adopt_input_strides` makes the backward's placeholders say so, and
   the backward's plan starts from them.

The decision, per graph (`decide`): `ember.config.conv_layout` = "as_traced" never plans, "channels_last"
plans any graph with a 2-D convolution of static sizes, "auto" (default) plans those where the kernel
backend of the convolution's device says its convolution library prefers channels-last
(`KernelBackend.channels_last_convolutions`) and a convolution has at least MIN_CHANNELS input or output
channels. Logged at debug level on the "ember.conv_layout" logger.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx

from ... import config
from ...device import backend_for

log = logging.getLogger("ember.conv_layout")
aten = torch.ops.aten

# operand positions read channels-last: (input, weight) and (grad_output, input, weight)
CONV_OPERANDS = {aten.convolution.default: (0, 1), aten.convolution_backward.default: (0, 1, 2)}
# channels below which a convolution alone does not make "auto" plan its graph (an image's 3 channels)
MIN_CHANNELS = 64
# ops whose result depends on their input's strides, not only on its values
_READS_STRIDES = {aten.as_strided.default, aten.as_strided_scatter.default, aten._reshape_alias.default}
# gm.meta keys: the traced values of placeholders that adopt_input_strides restrided; whether the plan
# changed the graph
ADOPTED_INPUTS = "ember_adopted_input_vals"
PLANNED = "ember_conv_layout_planned"


def decide(gm: torch.fx.GraphModule) -> tuple[bool, str]:
    """(plan the graph channels-last?, why)."""
    mode = config.conv_layout
    if mode not in ("auto", "channels_last", "as_traced"):
        raise ValueError(f"ember.config.conv_layout={mode!r}: use 'auto', 'channels_last' or 'as_traced'")
    if mode == "as_traced":
        return False, "conv_layout='as_traced'"
    convs = [n for n in gm.graph.nodes if _is_2d_convolution(n)]
    if not convs:
        return False, "no 2-D convolution"
    if not all(_static(n) for n in convs):
        return False, "a 2-D convolution has symbolic sizes"
    if mode == "channels_last":
        return True, f"conv_layout='channels_last' ({len(convs)} convolutions)"
    weight = _val(convs[0].args[CONV_OPERANDS[convs[0].target][-1]])
    if not backend_for(weight.device).channels_last_convolutions:
        return False, f"{weight.device.type} convolutions keep the traced layout"
    widest = max(max(_val(n.args[CONV_OPERANDS[n.target][-1]]).shape[:2]) for n in convs)
    if widest < MIN_CHANNELS:
        return False, f"at most {widest} channels (< {MIN_CHANNELS})"
    return True, f"{len(convs)} convolutions, up to {widest} channels, on {weight.device.type}"


def plan_conv_layouts(gm: torch.fx.GraphModule) -> None:
    """The post-grad pass: plan the graph's layouts (module docstring)."""
    planned, why = decide(gm)
    adopted = gm.meta.get(ADOPTED_INPUTS, {})
    log.debug("ember conv_layout: %s graph %s: %s", gm.meta.get("ember_graph_kind", "a"),
              "channels-last" if planned else "as traced", why)
    if not planned and not adopted:
        return
    planner = _Planner(gm.graph, adopted, planned)
    planner.run(_outputs_kept_as_planned(gm))
    gm.meta[PLANNED] = bool(planner.changed)
    if planner.changed:
        log.debug("ember conv_layout: %d operands converted to channels-last, %d values channels-last, "
                  "%d converted back to their traced layout", planner.to_channels_last_count,
                  len(planner.changed), len(planner.back))


def adopt_input_strides(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Give placeholders the strides of their example inputs where those differ from the traced ones: a
    backward graph reads the activations its forward saved in the layout that forward chose (AOTAutograd
    restrides the example inputs from the strides the forward reported). Their traced values are kept
    in gm.meta[ADOPTED_INPUTS] for the plan."""
    from torch._subclasses.fake_tensor import FakeTensor
    adopted = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, x in zip(placeholders, example_inputs):
        val = node.meta.get("val")
        if isinstance(x, FakeTensor) and isinstance(val, FakeTensor) and x.fake_mode is val.fake_mode and \
                x.shape == val.shape and x.dtype == val.dtype and _static_tensor(x) and _static_tensor(val) and \
                x.stride() != val.stride():
            adopted[node.name] = val
            node.meta["val"] = x
            node.meta.pop("tensor_meta", None)
    if adopted:
        gm.meta[ADOPTED_INPUTS] = adopted


def planned_output_strides(gm: torch.fx.GraphModule, outputs) -> list:
    """What the forward reports to AOTAutograd where it was planned: each output's stored strides (None
    for a non-tensor or a symbolic one). Empty where the graph was not planned: then nothing is reported
    and the backward assumes the traced strides."""
    if not gm.meta.get(PLANNED):
        return []
    strides = []
    for o in outputs:
        layout = getattr(o, "layout", None)
        st = getattr(layout, "stride", None)
        strides.append(tuple(int(s) for s in st) if st is not None and all(getattr(s, "is_Integer", type(s) is int) for s in st) else None)
    return strides


def report_output_strides(strides: list) -> None:
    """Tell AOTAutograd the strides of a forward graph's outputs (for its backward's example inputs)."""
    ctx = torch._guards.TracingContext.try_get()
    if strides and ctx is not None and ctx.output_strides is not None and not ctx.output_strides:
        ctx.output_strides.extend(strides)


class _Planner:
    """Walks the graph once in order: converts convolution operands, recomputes the fake values that
    change, converts back where a reader needs the traced layout."""

    def __init__(self, graph: torch.fx.Graph, adopted: dict, planned: bool):
        self.graph, self.planned = graph, planned
        self.traced: dict = {}            # node -> its traced value, for each node the plan restrided
        self.changed: set = set()
        self.channels_last: dict = {}     # node -> its channels-last conversion
        self.back: dict = {}              # node -> its conversion back to the traced layout
        self.to_channels_last_count = 0
        for node in graph.nodes:
            if node.op == "placeholder" and node.name in adopted:
                self.traced[node] = adopted[node.name]
                self.changed.add(node)

    def run(self, kept_outputs: set) -> None:
        for node in list(self.graph.nodes):
            if node.op != "call_function":
                continue
            if self.planned and _is_2d_convolution(node):
                self._convert_operands(node)
            elif any(a in self.changed for a in node.all_input_nodes):
                self._recompute(node)
        out = next(n for n in self.graph.nodes if n.op == "output")
        values = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
        fixed = [self._as_traced(v, out) if v in self.changed and i not in kept_outputs else v
                 for i, v in enumerate(values)]
        out.args = (type(values)(fixed) if isinstance(out.args[0], (list, tuple)) else fixed[0],)

    def _convert_operands(self, conv: torch.fx.Node) -> None:
        for i in CONV_OPERANDS[conv.target]:
            x = conv.args[i]
            if isinstance(x, torch.fx.Node) and not _val(x).is_contiguous(memory_format=torch.channels_last):
                conv.update_arg(i, self._to_channels_last(x, conv))
        self._recompute(conv)

    def _to_channels_last(self, x: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
        if x not in self.channels_last:
            with self.graph.inserting_before(before):
                node = self.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.channels_last})
            node.meta["val"] = _fake_run(node)
            self.channels_last[x] = node
            self.to_channels_last_count += 1
        return self.channels_last[x]

    def _as_traced(self, x: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
        """x copied into its traced layout: a clone whose fake value is the traced one (lowering stores a
        value read by an extern op or returned with its node's fake strides)."""
        if x not in self.back:
            traced = self.traced[x]
            fmt = torch.contiguous_format if traced.is_contiguous() else \
                torch.channels_last if traced.is_contiguous(memory_format=torch.channels_last) else torch.preserve_format
            with self.graph.inserting_before(before):
                node = self.graph.call_function(aten.clone.default, (x,), {"memory_format": fmt})
            node.meta["val"] = traced
            self.back[x] = node
        return self.back[x]

    def _recompute(self, node: torch.fx.Node) -> None:
        """node's fake value for its inputs' new layouts; where that cannot be had (or would change more
        than strides), its restrided inputs are converted back and it keeps its traced value."""
        old = node.meta.get("val")
        new = None
        if node.target is operator.getitem:
            parent = _val(node.args[0])
            new = parent[node.args[1]] if isinstance(parent, (list, tuple)) else None
        elif isinstance(node.target, torch._ops.OpOverload) and node.target not in _READS_STRIDES and \
                not node.target._schema.is_mutable:
            try:
                new = _fake_run(node)
            except Exception:
                new = None
        if new is None or not _same_but_strides(old, new):
            if node.target is operator.getitem:
                return          # its tuple's op was given traced inputs, or nothing changed
            for a in node.all_input_nodes:
                if a in self.changed:
                    node.replace_input_with(a, self._as_traced(a, node))
            return
        node.meta["val"] = new
        node.meta.pop("tensor_meta", None)
        if _strides_differ(old, new):
            self.traced.setdefault(node, old)
            self.changed.add(node)


def _outputs_kept_as_planned(gm: torch.fx.GraphModule) -> set:
    """Output positions that may keep the plan's layout: the tensors a forward graph saves for its
    backward (AOTAutograd's metadata says where they are), read by ember's backward only."""
    if gm.meta.get("ember_graph_kind") != "forward":
        return set()
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    try:
        saved = meta.tensors_saved_for_backwards_slice
    except Exception:
        return set()
    out = next(n for n in gm.graph.nodes if n.op == "output")
    n_outputs = len(out.args[0]) if isinstance(out.args[0], (list, tuple)) else 1
    return set(range(n_outputs)[saved]) if ctx.output_strides is not None else set()


def _is_2d_convolution(node) -> bool:
    if node.op != "call_function" or node.target not in CONV_OPERANDS:
        return False
    vals = [_val(node.args[i]) for i in CONV_OPERANDS[node.target]]
    return all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vals)


def _static(node) -> bool:
    return all(_static_tensor(_val(node.args[i])) for i in CONV_OPERANDS[node.target])


def _static_tensor(t) -> bool:
    return all(type(s) is int for s in (*t.shape, *t.stride(), t.storage_offset()))


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _fake_run(node: torch.fx.Node):
    """node's op run on its inputs' fake values."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
    vals = [v for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    fake_mode = next(v.fake_mode for v in vals if hasattr(v, "fake_mode"))
    with fake_mode:
        return node.target(*args, **kwargs)


def _tensors(v) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(v)] if isinstance(v, (list, tuple)) else [v]


def _same_but_strides(old, new) -> bool:
    a, b = _tensors(old), _tensors(new)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and (x.shape != y.shape or x.dtype != y.dtype or x.device != y.device):
            return False
    return True


def _strides_differ(old, new) -> bool:
    return any(isinstance(x, torch.Tensor) and x.stride() != y.stride()
               for x, y in zip(_tensors(old), _tensors(new)))
