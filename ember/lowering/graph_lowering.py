"""GraphLowering: an FX interpreter that runs each ATen node's lowering and decides what to realize.

Input: an ATen-level torch.fx.GraphModule whose nodes carry `meta["val"]` (fake tensors).
Output (attributes): `buffers` (every buffer in the order it was created, which is a valid execution
order), `graph_inputs`, `outputs`, and the symbols the wrapper must bind from input sizes.
"""
from __future__ import annotations

import logging
import math
import operator
from typing import Any

import sympy
import torch
import torch.fx

from .. import config, state
from ..graph.passes.common import VIEW_OPS
from ..ir.deps import record_loops
from ..ir.nodes import (Buffer, ComputedBuffer, ConstantBuffer, ExternKernel, InputBuffer, IRNode, Layout, Loops,
                        MultiOutput, Pointwise, ReinterpretView, TensorBox)
from ..ir.symbolic import exact_fraction, hint, integer_form, product, sympify
from .fallback import fallback, fallback_higher_order, store_dense
from .layouts import is_dense, is_non_overlapping, same_shape
from .mutation import flush_mutations
from .registry import Unsupported, get_lowering, load_all

log = logging.getLogger("ember")

aten = torch.ops.aten


class LoweringError(RuntimeError):
    def __init__(self, node: torch.fx.Node, cause: BaseException):
        self.node, self.cause = node, cause
        where = user_source_line(node)
        super().__init__(f"ember could not lower {node.format_node()} "
                         f"({type(cause).__name__}: {cause})" + (f"\n  from user code: {where}" if where else ""))


def user_source_line(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    # stack traces end with: File "...", line N, in fn \n <source line>
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            return lines[i] + (" :: " + lines[i + 1] if i + 1 < len(lines) else "")
    return ""


class GraphLowering(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, example_inputs=None):
        super().__init__(gm, garbage_collect_values=False)
        load_all()
        self.gm = gm
        self.buffers: list[Buffer] = []
        self.name_to_buffer: dict[str, Buffer] = {}
        self.graph_inputs: dict[str, Any] = {}      # name -> InputBuffer or sympy expr
        self.graph_input_names: list[str] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.outputs: list[Any] = []
        self.symbol_hints: dict[sympy.Symbol, int] = {}
        self.shape_env = None                       # the inputs' ShapeEnv, where decisions install guards
        self.current_node: torch.fx.Node | None = None
        self.pending_mutations: list = []      # (input buffer, TensorBox of its new value): see mutation.py
        # gemm_templates="auto": {FX node: template launch config or None}, made at the first product
        # (lowering/matmul.py)
        self.product_choices: dict | None = None
        self._ids = 0

    # -- bookkeeping --------------------------------------------------------------------------------

    def register_buffer(self, buf: Buffer) -> Buffer:
        if buf.name is None:
            buf.name = f"buf{self._ids}"
            self._ids += 1
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf
        if self.current_node is not None:
            buf.origin = self.current_node
        return buf

    def get_buffer(self, name: str) -> Buffer:
        if name in self.name_to_buffer:
            return self.name_to_buffer[name]
        return self.graph_inputs[name]

    def get_dtype(self, name: str) -> torch.dtype:
        return self.get_buffer(name).dtype

    def _note_symbols(self, val):
        if isinstance(val, torch.Tensor):
            for s in list(val.shape) + list(val.stride()) + [val.storage_offset()]:
                self._note_symbols(s)
        elif isinstance(val, torch.SymInt):
            expr = val.node.expr
            for sym in expr.free_symbols:
                if sym not in self.symbol_hints:
                    env = self.shape_env = val.node.shape_env
                    table = getattr(env, "backed_var_to_val", None)   # torch >= 2.13
                    if table is None:
                        table = env.var_to_val
                    h = table.get(sym)
                    if h is not None:
                        self.symbol_hints[sym] = int(h)

    # -- running ------------------------------------------------------------------------------------

    def run(self, *args):
        with state.bind(state.graph, self):
            return super().run(*args)

    def run_node(self, n: torch.fx.Node):
        self.current_node = n
        try:
            result = super().run_node(n)
        except (LoweringError, NotImplementedError) as e:
            raise e if isinstance(e, LoweringError) else LoweringError(n, e)
        except Exception as e:
            raise LoweringError(n, e) from e
        if n.op == "call_function" and isinstance(result, TensorBox):
            self._maybe_realize(n, result)
        return result

    def _maybe_realize(self, n: torch.fx.Node, box: TensorBox):
        if not isinstance(box.data, Pointwise):
            return
        h = record_loops(box.data.inner_fn, box.data.ranges)
        users = len(n.users)
        # a value read by several consumers is recomputed by each one it is inlined into: worth it
        # while its body is cheap; one that reads many buffers (a residual stream) is stored once.
        # Small tensors (per-row statistics, scalars) count as one read together: repeating them costs
        # next to nothing, and storing the value would cost a full write and read.
        large = list(self._is_large({d.name for d in h.reads}, box))
        reads = sum(large) + (not all(large))
        if h.op_count > config.realize_max_ops or (
                users > 1 and (h.op_count > config.inline_max_ops or reads > config.inline_max_reads)):
            self._store_like_eager(box, n.meta.get("val"))

    def _is_large(self, names, box: TensorBox):
        """For each buffer name: is it at least a quarter the size of the value computed from it?"""
        numel = hint(product(box.get_size()))
        for name in names:
            try:
                size = self.get_buffer(name).get_size()
            except (KeyError, AttributeError):
                yield True
                continue
            yield 4 * hint(product(size)) >= numel

    def _store_like_eager(self, box: TensorBox, meta) -> None:
        """Store a computed value with eager's strides where those are dense (channels_last stays
        channels_last): it may turn out to be a graph output, which must have them. A channels-last value (a
        convolution plan's) is written in memory order, as its readers and producers walk it: in logical
        order ResNet-50's max pool read and wrote with a stride of 64 (430 us of a 1.9 ms inference step on
        an H200). Other permuted layouts (attention's transposes) keep the logical order, which the 2-D
        tiling serves: in memory order BERT-base's training step took 23.2 ms against 17.2."""
        if same_shape(meta, box) and is_dense(meta):
            self._store_as_eager(box, meta)
        else:
            box.realize()

    def _store_as_eager(self, box: TensorBox, meta) -> None:
        """Store a computed value with its fake value's strides; a channels-last one in memory order."""
        stride = [sympify(s) for s in meta.stride()]
        if meta.dim() == 4 and meta.is_contiguous(memory_format=torch.channels_last) and not meta.is_contiguous():
            store_dense(box, stride)
        else:
            self.store_with_strides(box, stride)

    def store_with_strides(self, box: TensorBox, stride: list) -> None:
        """Store a computed (not yet stored) value as a buffer with these strides."""
        layout = Layout(box.device, box.dtype, list(box.get_size()), stride)
        box.data = self.register_buffer(ComputedBuffer(None, layout, box.data))

    def placeholder(self, target, args, kwargs):
        node = self.current_node
        val = node.meta.get("val")
        if val is None:
            raise Unsupported(f"placeholder {target} has no meta['val']")
        name = _sanitize(node.name)
        self.graph_input_names.append(name)
        self._note_symbols(val)
        if isinstance(val, torch.Tensor):
            buf = InputBuffer(name, Layout.from_tensor(val))
            self.graph_inputs[name] = buf
            return TensorBox(buf)
        if isinstance(val, (torch.SymInt, int)):
            expr = sympify(val)
            self.graph_inputs[name] = expr
            return expr
        if isinstance(val, (torch.SymFloat, torch.SymBool, float, bool)):
            raise Unsupported(f"graph input {name} is a {type(val).__name__}")
        # anything else (DTensor's opaque objects; the torch.Generator inputs through which AOTAutograd's
        # CUDA-graph-safe replay of a checkpointed random op keeps forward and backward in step) is
        # passed on as the object the call receives, never the one seen while tracing
        self.graph_inputs[name] = val
        return val

    def get_attr(self, target, args, kwargs):
        value = getattr(self.gm, target) if not "." in target else operator.attrgetter(target)(self.gm)
        if not isinstance(value, torch.Tensor):
            return value
        name = _sanitize(target)
        self.constants[name] = value
        buf = ConstantBuffer(name, Layout.from_tensor(value), value)
        self.graph_inputs[name] = buf
        return TensorBox(buf)

    def call_function(self, target, args, kwargs):
        if target is operator.getitem:
            return args[0][args[1]]
        if target in _SYMBOLIC_OPS:
            return _SYMBOLIC_OPS[target](*args)
        if isinstance(target, torch._ops.OpOverload):
            lowering = get_lowering(target)
            if lowering is not None and not _has_complex(self.current_node):
                try:
                    return lowering(*args, **kwargs)
                except Unsupported as e:      # why an op ember lowers runs as an ATen call here
                    log.debug("ember: %s runs as an ATen call: %s", target, e)
            return fallback(target, args, kwargs, self.current_node)
        if isinstance(target, torch._ops.HigherOrderOperator):
            lowering = get_lowering(target)
            if lowering is not None:
                try:
                    return lowering(*args, **kwargs)
                except Unsupported as e:
                    log.debug("ember: %s runs as an ATen call: %s", target, e)
            return fallback_higher_order(target, args, kwargs, self.current_node)
        if callable(target) and _is_sym_python_op(target):
            if target is torch.sym_float and args and isinstance(args[0], sympy.Expr):
                return args[0]      # a size as a float (a resize's scaled size): the same value
            # math.ceil / floor / trunc of a symbolic quotient or of a size times a float: sympy's functions
            # (Python's would ask the expression for a float), which integer_form below writes as the floor of
            # an exact fraction; a size is non-negative, so trunc is floor
            sym = _ROUNDINGS.get(target) if args and isinstance(args[0], sympy.Expr) else None
            if sym is not None and exact_fraction(args[0]) is None:
                raise Unsupported(f"{target.__name__} of {args[0]}: a size computed in rounded float arithmetic")
            if target in _EXTREMES and any(isinstance(a, sympy.Expr) for a in args):
                sym = _EXTREMES[target]       # TF-style "same" padding: max(p - s, 0) of sizes
            result = sym(*args) if sym is not None else target(*args)
            # Python's `//` and `%` on sympy values are sympy's floor(a/b) and Mod: an integer size is
            # written as ember writes it, to meet the sizes it equals
            if isinstance(result, sympy.Basic) and isinstance(self.current_node.meta.get("val"), (torch.SymInt, int)):
                return integer_form(result)
            return result
        raise Unsupported(f"call_function target {target} is not an ATen op")

    def output(self, target, args, kwargs):
        result = args[0]
        outs = result if isinstance(result, (list, tuple)) else [result]
        vals = self.current_node.args[0]
        vals = vals if isinstance(vals, (list, tuple)) else [vals]
        realized = {}       # a value returned at several positions (a user output also saved for the
        for out, fx_val in zip(outs, vals):       # backward) is stored, or copied into eager's strides, once
            if isinstance(out, TensorBox) and isinstance(fx_val, torch.fx.Node) and fx_val in realized:
                self.outputs.append(realized[fx_val])
            elif isinstance(out, TensorBox):
                meta = fx_val.meta.get("val") if isinstance(fx_val, torch.fx.Node) else None
                if isinstance(out.data, Loops) and isinstance(meta, torch.Tensor) and not is_dense(meta):
                    out = self._as_view_of_stored_base(fx_val, meta) or out
                self.outputs.append(self._realize_output(out, meta))
                if isinstance(fx_val, torch.fx.Node):
                    realized[fx_val] = self.outputs[-1]
            else:
                self.outputs.append(out)
        flush_mutations(self)       # writes into inputs land after every read of their old values
        return result

    def _as_view_of_stored_base(self, node: torch.fx.Node, meta: torch.Tensor):
        """An output that eager returns as a view of an intermediate (a slice with an offset, a strided
        select ...) is returned as that same view of the intermediate, stored with eager's layout: a
        backward graph that reads it was compiled for exactly that size, stride and offset. The base is
        stored and the chain of view ops from it replayed on the stored buffer. None where that does
        not give eager's layout."""
        chain = []
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
                (node.target in VIEW_OPS or _is_split_item(node)):
            chain.append(node)
            node = node.args[0].args[0] if _is_split_item(node) else node.args[0]
        base = self.env.get(node) if isinstance(node, torch.fx.Node) else None
        base_meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not chain or not isinstance(base, TensorBox) or not isinstance(base.data, Loops) or \
                not isinstance(base_meta, torch.Tensor) or not is_dense(base_meta) or \
                base_meta.dim() != base.dim():
            return None
        base.data = self.register_buffer(ComputedBuffer(
            None, Layout(base.device, base.dtype, list(base.get_size()), [sympify(s) for s in base_meta.stride()]),
            base.data))
        value = base
        try:
            for n in reversed(chain):
                if _is_split_item(n):
                    split_node = n.args[0]
                    args = [value] + list(self.map_nodes_to_values(split_node.args[1:], split_node))
                    value = get_lowering(split_node.target)(*args, **self.map_nodes_to_values(split_node.kwargs, n))[n.args[1]]
                else:
                    args = [value] + list(self.map_nodes_to_values(n.args[1:], n))
                    value = get_lowering(n.target)(*args, **self.map_nodes_to_values(n.kwargs, n))
        except Exception:
            return None
        want = Layout.from_tensor(meta)
        got = value.data.layout if isinstance(value, TensorBox) and isinstance(value.data, ReinterpretView) else None
        if got is None or list(got.size) != list(want.size) or got.offset != want.offset or \
                any(n != 1 and a != b for n, a, b in zip(want.size, got.stride, want.stride)):
            return None
        return value

    def _realize_output(self, box: TensorBox, meta) -> IRNode:
        if isinstance(box.data, Loops):
            # store outputs with eager's strides, so users see the same layout, and so does a backward
            # graph that reads a saved output: it was compiled for the fake tensor's strides. A view
            # (strides with gaps) is stored with its strides too, where it starts at offset 0.
            if isinstance(meta, torch.Tensor) and len(meta.shape) == len(box.get_size()) and \
                    (is_dense(meta) or is_non_overlapping(meta)):
                self._store_as_eager(box, meta)
            else:
                box.realize()
        elif isinstance(box.data, (ComputedBuffer, ExternKernel, MultiOutput, ReinterpretView)) and \
                _differs_from(box.data.layout, meta):
            # stored earlier (or viewed) with other strides than eager's: a backward graph reading this
            # output was compiled for the fake tensor's strides, so return a copy in them. A view gets
            # here when a pass rewrote its base: a padded matmul's result sliced back to eager's size
            box = TensorBox.pointwise(box.device, box.dtype, box.make_loader(), list(box.get_size()))
            self._store_as_eager(box, meta)
        return box.data


def _differs_from(layout, meta) -> bool:
    """Does a stored layout disagree with eager's dense strides (size-1 dims' strides never matter)?"""
    if not isinstance(meta, torch.Tensor) or not is_dense(meta) or layout is None or \
            [sympify(s) for s in meta.shape] != list(layout.size):
        return False
    return any(sympify(n) != 1 and a != sympify(b) for n, a, b in zip(meta.shape, layout.stride, meta.stride()))


def _is_split_item(node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
        and node.args[0].target in (aten.split.Tensor, aten.split_with_sizes.default)


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if not out[0].isdigit() else "_" + out


def _has_complex(node: torch.fx.Node) -> bool:
    def is_complex(v):
        return isinstance(v, torch.Tensor) and (v.is_complex() or v.dtype in _UNSUPPORTED_DTYPES)
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = []
    for v in vals:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return any(is_complex(v) for v in flat)


_UNSUPPORTED_DTYPES = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
                                                    "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)}


def _is_sym_python_op(target) -> bool:
    return getattr(target, "__module__", "") in ("_operator", "operator", "math", "torch.sym_float", "torch") \
        or target in (torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min)


_ROUNDINGS = {math.ceil: sympy.ceiling, math.floor: sympy.floor, math.trunc: sympy.floor}
# torch.sym_max / sym_min of a size: sympy's (torch's would ask a sympy value for a number)
_EXTREMES = {torch.sym_max: sympy.Max, torch.sym_min: sympy.Min}

_SYMBOLIC_OPS = {
    aten.sym_size.int: lambda x, d: x.get_size()[d],
    aten.sym_stride.int: lambda x, d: _stride_of(x, d),
    aten.sym_numel.default: lambda x: x.numel(),
    aten.sym_storage_offset.default: lambda x: _offset_of(x),
}


def _stride_of(box, d):
    data = box.realize()
    return data.layout.stride[d]


def _offset_of(box):
    return box.realize().layout.offset
