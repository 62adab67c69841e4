"""What the report knows of each compiled graph, gathered while it compiles: its fusion groups with the FX
nodes and user source lines behind each, and each device call (kernel or extern) with the bytes it moves
(from its ProfiledCall), its FLOPs and its kind. The profiled times are joined in later (profile.py).

FLOPs: an extern matrix product, convolution or attention counts what torch.utils.flop_counter's formula
says for its shapes; an ember kernel counts, per node it computes, the arithmetic ops of its body
(each math op, select, reduction and scan step, not loads, stores, index arithmetic, constants or casts)
times the elements the node runs over. Sizes are the compile-time hints where they are symbolic."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..codegen.nan_checks import ValueOrigins
from ..codegen.wrapper.lines import CallExtern, CallKernel
from ..ir.deps import RecordingHandler
from ..ir.nodes import Buffer, ComputedBuffer, ExternKernel, MultiOutput, ReinterpretView, TensorBox
from ..ir.ops import handler
from ..ir.symbolic import hint
from ..lowering.graph_lowering import user_source_line
from ..lowering.registry import get_lowering

# the kinds of time in a step, in the order the chart stacks them
GEMM, ATTENTION, MEMORY, OTHER_EXTERN = "GEMM / convolution", "attention", "memory-bound kernels", "other externs"
OUTSIDE, HOST = "outside compiled graphs", "host gaps"
CATEGORIES = (GEMM, ATTENTION, MEMORY, OTHER_EXTERN, OUTSIDE, HOST)

_GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "_int_mm", "_scaled_mm", "addmv", "mv", "dot", "vdot", "matmul",
             "convolution", "_convolution", "convolution_backward", "cudnn_convolution",
             "cudnn_convolution_transpose", "mkldnn_convolution", "_slow_conv2d_forward", "padded_mm",
             "chunk_padded_mm", "chunk_padded_mm_pair"}


# ember's padded products (graph/custom_ops.py) -> the position of b in (a, ..., b, ...): a (either way round)
# holds M and K, b's columns are N
_PADDED_PRODUCT_B = {"padded_mm": 1, "chunk_padded_mm": 2}


@dataclasses.dataclass
class CallRecord:
    """One device call of a graph's wrapper: a kernel launch or an extern (ATen) call."""
    graph: int
    range: str                     # the profiler range around it
    label: str                     # "kernel3", or the ATen op: "aten.mm.default"
    kind: str                      # "kernel" or "extern"
    category: str                  # one of CATEGORIES
    backend: str                   # "cpp", "triton", "aten"
    device: str
    dtype: Optional[torch.dtype]   # an extern's first tensor argument's (its GEMM peak); None for kernels
    bytes_read: int
    bytes_written: int
    flops: int
    group: int
    fx_nodes: list
    source_lines: list
    reason: str = ""               # an extern's: why it runs as an ATen call


@dataclasses.dataclass
class GroupRecord:
    index: int
    call: str                      # "kernel3", "extern aten.mm.default" ...
    buffers: list
    fx_nodes: list
    source_lines: list


@dataclasses.dataclass
class GraphRecord:
    id: int
    kind: str                      # forward, backward, inference
    prefix: str                    # of the profiler ranges of its calls: "ember g3"
    compile_id: str = ""           # Dynamo's frame/compile id, "0/1"
    device: str = ""
    compile_seconds: float = 0.0
    # Per-stage compile seconds, {stage: seconds} in pipeline order, for a compile profile to fill where one
    # is kept (the page shows a column per stage when any graph has them)
    stage_seconds: dict = dataclasses.field(default_factory=dict)
    fx_node_count: int = 0
    groups: list = dataclasses.field(default_factory=list)
    calls: list = dataclasses.field(default_factory=list)
    times_called: int = 0

    @property
    def range(self) -> str:
        """The profiler range around each call of the graph: "ember g3 forward"."""
        return f"{self.prefix} {self.kind}"

    @property
    def kernel_count(self) -> int:
        return sum(1 for c in self.calls if c.kind == "kernel")

    @property
    def extern_count(self) -> int:
        return sum(1 for c in self.calls if c.kind == "extern")


def collect_graph(record: GraphRecord, gm, lowering, groups, program) -> None:
    """Fill `record` from a compile's lowering, fused groups and WrapperProgram (within the compile, with
    its lowering bound as the current graph)."""
    origins = ValueOrigins(lowering)
    record.fx_node_count = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    compile_id = torch._guards.CompileContext.current_compile_id()
    record.compile_id = str(compile_id) if compile_id is not None else ""
    fx_of = [_group_fx_nodes(g, lowering, origins) for g in groups]
    labels: dict = {}
    for ln in program.lines:
        if not isinstance(ln, (CallKernel, CallExtern)) or ln.profile is None:
            continue
        p = ln.profile
        group = groups[p.group]
        nodes = fx_of[p.group]
        if isinstance(ln, CallKernel):
            labels.setdefault(p.group, []).append(ln.name)
            call = CallRecord(record.id, p.range, ln.name, "kernel", MEMORY, _backend_name(program, ln.name),
                              _device_of(None, group), None, p.bytes_read, p.bytes_written, _kernel_flops(group),
                              p.group,
                              [n.name for n in nodes], _source_lines(nodes))
        else:
            buf = lowering.get_buffer(ln.name) if ln.name else None
            extern = buf if isinstance(buf, ExternKernel) else _extern_of(group, ln.op)
            node = origins.fx_node(extern) if extern is not None else None
            op_nodes = [node] if node is not None else nodes
            label = str(getattr(ln.op, "__name__", ln.op))
            labels.setdefault(p.group, []).append(f"extern {label}")
            call = CallRecord(record.id, p.range, label, "extern", extern_category(ln.op), "aten",
                              _device_of(extern, group),
                              _first_tensor_dtype(extern), p.bytes_read, p.bytes_written, extern_flops(extern),
                              p.group, [n.name for n in op_nodes], _source_lines(op_nodes),
                              fallback_reason(ln.op, op_nodes[0] if op_nodes else None))
        record.calls.append(call)
    for i, g in enumerate(groups):
        what = ", ".join(dict.fromkeys(labels.get(i, []))) or "(no device call)"
        record.groups.append(GroupRecord(i, what, [n.name for n in g.nodes], [n.name for n in fx_of[i]],
                                         _source_lines(fx_of[i])))
    devices = {c.device for c in record.calls}
    record.device = ", ".join(sorted(devices))


def _backend_name(program, kernel: str) -> str:
    for d in program.kernels():
        if d.name == kernel:
            return d.backend.name
    return ""


def _extern_of(group, op) -> Optional[ExternKernel]:
    for n in group.nodes:
        if isinstance(n.buf, ExternKernel) and n.buf.op is op:
            return n.buf
    return None


def _group_fx_nodes(group, lowering, origins) -> list:
    """The FX nodes a group computes: the node behind each buffer it writes, and the nodes whose values
    were inlined into those (values never stored, computed inside this group's kernel)."""
    env = getattr(lowering, "env", {})
    seen: dict = {}
    stack = [origins.fx_node(n.buf) for n in group.nodes if not isinstance(n.buf, MultiOutput)]
    while stack:
        node = stack.pop()
        if node is None or node in seen or node.op != "call_function":
            continue
        seen[node] = True
        for arg in node.all_input_nodes:
            value = env.get(arg)
            if isinstance(value, TensorBox) and not value.is_realized():
                stack.append(arg)
    order = {n: i for i, n in enumerate(lowering.gm.graph.nodes)}
    return sorted(seen, key=lambda n: order.get(n, 0))


def _source_lines(nodes) -> list:
    return list(dict.fromkeys(s for s in (user_source_line(n) for n in nodes) if s))


class _ArithmeticCounter(RecordingHandler):
    """Counts a body's arithmetic: every op but loads, stores, index arithmetic, constants and casts."""
    _not_arithmetic = {"constant", "to_dtype"}

    def __init__(self):
        super().__init__()
        self.arithmetic = 0

    def _default(self, name, args, kwargs):
        if name not in self._not_arithmetic:
            self.arithmetic += 1
        return super()._default(name, args, kwargs)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        self.arithmetic += 1
        return super().reduction(dtype, src_dtype, reduction_type, value)


def _kernel_flops(group) -> int:
    total = 0
    for n in group.nodes:
        if not isinstance(n.buf, ComputedBuffer):
            continue
        counter = _ArithmeticCounter()
        with handler(counter):
            n.buf.store_body(n.ivars, n.rvars)
        elements = 1
        for s in list(n.ranges) + list(n.rranges):
            elements *= hint(s)
        total += counter.arithmetic * elements
    return total


def extern_category(op) -> str:
    name = _packet_name(op)
    if name in _GEMM_OPS:
        return GEMM
    if "attention" in name:
        return ATTENTION
    return OTHER_EXTERN


def _packet_name(op) -> str:
    packet = getattr(op, "overloadpacket", None)
    return getattr(packet, "__name__", None) or str(getattr(op, "__name__", op)).split(".")[0]


def fallback_reason(op, node) -> str:
    """Why an op runs as an ATen call rather than as an ember kernel."""
    name = _packet_name(op)
    if name in _GEMM_OPS:
        return "library GEMM (cuBLAS, cuDNN, the CPU's BLAS): ember has no GEMM template yet"
    if "attention" in name:
        return "library attention kernel: ember has no attention template yet"
    if isinstance(op, torch._ops.HigherOrderOperator):
        return "a higher-order op (a user kernel) runs as it is"
    if get_lowering(op) is None:
        return "no ember lowering for this op"
    vals = node.meta.get("val") if node is not None else None
    if any(isinstance(v, torch.Tensor) and v.is_complex() for v in (vals if isinstance(vals, (list, tuple)) else [vals])):
        return "complex values: ember's kernels compute real numbers"
    return "ember's lowering does not handle these arguments (it declined them)"


def _meta(a):
    """A meta tensor with the layout of an IR argument (for a FLOP formula), or the argument itself."""
    if isinstance(a, (Buffer, ReinterpretView)):
        l = a.layout
        if l is None:
            return None
        return torch.empty_strided([hint(s) for s in l.size], [hint(s) for s in l.stride], dtype=l.dtype,
                                   device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta(b) for b in a)
    if hasattr(a, "free_symbols"):          # a sympy size
        return hint(a)
    return a


def extern_flops(extern: Optional[ExternKernel]) -> int:
    """FLOPs of an extern call by torch.utils.flop_counter's formula for its op (0 for ops it has none for,
    which are not arithmetic-bound); ember::padded_mm, chunk_padded_mm and chunk_padded_mm_pair count as the
    products they compute."""
    if extern is None:
        return 0
    from torch.utils.flop_counter import flop_registry
    packet = getattr(extern.op, "overloadpacket", None)
    try:
        args = [_meta(a) for a in extern.args]
        kwargs = {k: _meta(v) for k, v in extern.kwargs.items()}
        if _packet_name(extern.op) == "chunk_padded_mm_pair":       # (g, b, bt): g @ b and g.t() @ bt
            g, b, bt = args[:3]
            return 2 * int(g.shape[0]) * int(g.shape[1]) * (int(b.shape[1]) + int(bt.shape[1]))
        if _packet_name(extern.op) in _PADDED_PRODUCT_B:
            a, b = args[0], args[_PADDED_PRODUCT_B[_packet_name(extern.op)]]
            return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[1])
        formula = flop_registry.get(packet)
        if formula is None:
            return 0
        out = _meta(extern) if extern.layout is not None else None
        return int(formula(*args, out_val=out, **kwargs))
    except Exception:       # a formula that does not fit these arguments: no FLOPs claimed
        return 0


def _first_tensor_dtype(extern) -> Optional[torch.dtype]:
    if extern is None:
        return None
    for a in extern.input_nodes():
        if a.layout is not None:
            return a.layout.dtype
    return None


def _device_of(extern, group) -> str:
    """Where a call runs: its extern's layout's device, else that of the first node of its group that has a
    layout (the parent of a multi-output extern, such as CPU flash attention's, has none)."""
    candidates = ([extern] if extern is not None else []) + [n.buf for n in group.nodes]
    for buf in candidates:
        layout = getattr(buf, "layout", None)
        if layout is not None:
            return str(layout.device)
    return "cpu"
