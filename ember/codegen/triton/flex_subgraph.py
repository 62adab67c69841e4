"""FlexAttention's score_mod / mask_mod / joint subgraphs -> lines of Triton over a [BLOCK_M, BLOCK_N] tile.

A subgraph is an ATen FX graph over 0-d tensors (the score, the indices b, h, q_idx, kv_idx, and the
tensors the user's function captured). It is lowered with ember's own lowering table, as any graph is,
with each index placeholder a 0-d Pointwise whose value is `ops.index_expr` of a symbol the kernel binds
(`flex_b`, `flex_h` are scalars, `flex_q_idx` a [BLOCK_M, 1] column, `flex_kv_idx` a [1, BLOCK_N] row) and
the score a 0-d Pointwise reading a tile the kernel holds. Each output's `inner_fn` is then run under
`SubgraphRenderer`, the Triton spelling of ember's ops with loads from the captured tensors masked to the
tile. Anything the lowering or the renderer does not cover raises Unsupported, and the caller runs the
whole attention as an ATen call.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from ... import state
from ...graph import decompose
from ...ir.nodes import Buffer, ConstantBuffer, Layout, Pointwise, ReinterpretView, TensorBox
from ...ir.op_table import compute_dtype
from ...ir.ops import RANDOM, handler, ops
from ...lowering.registry import Unsupported, get_lowering
from ..kernel import KValue, print_index
from .spelling import TritonSpelling, triton_type

INDEX_SYMBOLS = tuple(sympy.Symbol(n, integer=True, nonnegative=True)
                      for n in ("flex_b", "flex_h", "flex_q_idx", "flex_kv_idx"))


class _TileValue:
    """The value `ops.tile_value(name)` stands for: a tensor the kernel holds under `name`."""


class SubgraphRenderer(TritonSpelling):
    """An ops handler that writes one Triton line per op into `lines` and returns KValues. Loads read the
    captured tensors through the pointer parameters `pointers` names (buffer name -> parameter; `bases` the
    buffers, in parameter order; a constant the subgraph reads is added to both), masked with `mask` (the
    tile's in-bounds elements), so a tail row or column never reads out of bounds."""

    def __init__(self, prefix: str, pointers: dict, mask: str, bases: list):
        self.prefix, self.pointers, self.mask, self.bases = prefix, pointers, mask, bases
        self.lines: list[str] = []
        self.count = 0
        self.graph = state.current_graph()
        # symbols whose value differs across the tile (the rest are one value per program)
        self.tile_symbols = {s.name for s in INDEX_SYMBOLS[2:]}

    def _value(self, expr, dtype, kind, operands, costly) -> KValue:
        name = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {expr}")
        return KValue(name, dtype, kind)

    def _kind(self, index) -> str:
        return "x" if any(s.name in self.tile_symbols for s in sympy.sympify(index).free_symbols) else "scalar"

    def tile_value(self, name: str, dtype) -> KValue:
        return KValue(name, dtype, "x")

    def index_expr(self, expr, dtype):
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        return self._value(f"({print_index(expr)}).to({triton_type(dtype)})", dtype, self._kind(expr), (), False)

    def indirect_indexing(self, value: KValue, size, check=True):
        v = self._value(f"tl.where({value} < 0, {value} + {print_index(size)}, {value})", value.dtype,
                        value.kind, (), False)
        if v.kind == "x":
            self.tile_symbols.add(v.name)
        return sympy.Symbol(v.name, integer=True, nonnegative=True)

    def load(self, name: str, index):
        if name not in self.pointers:
            buf = self.graph.graph_inputs.get(name)
            if not isinstance(buf, ConstantBuffer):
                raise Unsupported(f"flex subgraph reads {name}, which is no captured tensor")
            self.pointers[name] = f"CAP{len(self.pointers)}"
            self.bases.append(buf)
        dtype = self.graph.get_dtype(name)
        index = sympy.sympify(index)
        kind = self._kind(index)
        # an element per tile position is read where the position is inside the sequences; one element per
        # program (a per-head slope) is read unmasked, by a scalar pointer
        mask = f", {self.mask}, other=0" if kind == "x" else ""
        expr = f"tl.load({self.pointers[name]} + ({print_index(index)}){mask})"
        if dtype == torch.bool:
            expr += ".to(tl.int1)"
        elif compute_dtype(dtype) != dtype:
            expr += f".to({triton_type(compute_dtype(dtype))})"
        return self._value(expr, compute_dtype(dtype), kind, (), False)

    def __getattr__(self, name):
        if name in ("store", "store_reduction", "reduction", "scan", *RANDOM):
            raise Unsupported(f"flex subgraph uses {name}")
        return super().__getattr__(name)


def _index_box(device, symbol) -> TensorBox:
    return TensorBox.pointwise(device, torch.int32, lambda idx: ops.index_expr(symbol, torch.int32), [])


def _tile_box(device, name: str, dtype) -> TensorBox:
    return TensorBox.pointwise(device, dtype, lambda idx: ops.tile_value(name, dtype), [])


def lower_subgraph(gm: torch.fx.GraphModule, leading: list, captured: list) -> list:
    """The outputs of subgraph `gm` as 0-d TensorBoxes (None for a None output). `leading` are the values of
    its first placeholders (TensorBoxes or None where a placeholder is unused), `captured` the stored tensors
    bound to the rest. Raises Unsupported where a node has no lowering or the lowering stores anything."""
    gm = _decomposed(gm)
    g = state.current_graph()
    before = len(g.buffers)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = list(leading) + list(captured)
    if len(values) != len(placeholders):
        raise Unsupported("flex subgraph placeholders do not match its arguments")
    try:
        outs = _run_lowerings(gm, placeholders, values)
    finally:
        if len(g.buffers) != before:      # never keep a stored piece of a subgraph: it reads tile values
            for b in g.buffers[before:]:
                g.name_to_buffer.pop(b.get_name(), None)
            del g.buffers[before:]
            raise Unsupported("flex subgraph stores an intermediate value")
    for o in outs:
        if o is not None and not (isinstance(o, TensorBox) and isinstance(o.data, Pointwise)):
            raise Unsupported("flex subgraph output is not elementwise")
    return outs


def _decomposed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The subgraph with ember's decompositions applied, as the main graph has them (a joint graph holds
    backward ops such as tanh_backward that ember lowers only decomposed)."""
    if not decompose.needs_decomposition(gm):
        return gm
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        raise Unsupported("flex subgraph placeholders without example values")
    return decompose.decompose(gm, vals)


def _constant(gm, target: str) -> TensorBox:
    """A tensor the subgraph holds as an attribute (a mask_mod's closure, where nothing lifted it into the
    HOP's arguments): a constant of the graph being lowered, read by the kernel through a pointer."""
    value = getattr(gm, target)
    if not isinstance(value, torch.Tensor):
        raise Unsupported("flex subgraph attribute that is not a tensor")
    g = state.current_graph()
    name = f"flex_constant{len(g.constants)}"
    g.constants[name] = value
    buf = ConstantBuffer(name, Layout.from_tensor(value), value)
    g.graph_inputs[name] = buf
    return TensorBox(buf)


def _run_lowerings(gm, placeholders, values) -> list:
    env: dict = {}
    result = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = values[placeholders.index(n)]
        elif n.op == "call_function":
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            lowering = get_lowering(n.target) if isinstance(n.target, torch._ops.OpOverload) else None
            if lowering is None:
                raise Unsupported(f"flex subgraph op {n.target} has no lowering")
            env[n] = lowering(*args, **kwargs)
        elif n.op == "get_attr":
            env[n] = _constant(gm, n.target)
        elif n.op == "output":
            result = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
        else:
            raise Unsupported(f"flex subgraph node {n.op}")
    return list(result) if isinstance(result, (list, tuple)) else [result]


def render(box: TensorBox, renderer: SubgraphRenderer) -> KValue:
    """Run `box`'s 0-d inner_fn under `renderer`: its lines hold the computation, the result is returned."""
    with handler(renderer):
        return box.data.inner_fn([])


class SubgraphInputs:
    """The values a subgraph is lowered with, for one kernel: the index placeholders and the captured
    tensors (each a stored buffer, passed to the kernel by a pointer parameter of its own)."""

    def __init__(self, device, captured: list):
        self.device = device
        self.index = [_index_box(device, s) for s in INDEX_SYMBOLS]
        self.captured = list(captured)

    def tile(self, name: str, dtype=torch.float32) -> TensorBox:
        return _tile_box(self.device, name, dtype)


def captured_base(x) -> Buffer:
    """The buffer a captured tensor's loads name (a view's loads name its base)."""
    return x.data if isinstance(x, ReinterpretView) else x
