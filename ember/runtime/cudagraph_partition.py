"""CUDA graphs around what cannot be recorded: a graph whose blockers are single nodes (a CPU tensor made or
read, a host synchronization such as `.item()` or `nonzero`, a data-dependent size, an op tagged
`cudagraph_unsafe`) is split into segments. Each maximal run of nodes that can be recorded is compiled by
ember as a graph of its own and recorded by its own `CudaGraphRunner` (a captured partition,
`ember.metrics.cudagraph_partitions`); the nodes between them run eagerly, as the ATen ops they are (ember
may not compile them: `.item()` and data-dependent sizes). `PartitionedGraph` runs the pieces in order.

The segments follow the graph's order, except that the nodes that can be recorded and depend on no node
that cannot are moved to the front, so that a blocker does not cut apart work that does not depend on it;
nothing moves past an op that writes into memory or draws random numbers.

What crosses from one piece to the next becomes an output of the one and an input of the other:
- an input of a captured partition that is an input of the whole graph used in place (a parameter, a
  buffer; in a backward graph anything but the incoming gradients) is used in place by the partition too;
- an input that is the output of an earlier captured partition lies in a recording's memory, which the
  runner reads in place; the rest (outputs of the eager pieces, other graph inputs) are copied in;
- an integer that depends on data (`n = t.sum().item()` used later as a scalar) is an integer input of the
  partition that reads it, so the partition keeps one recording per value, as for a size; every size symbol
  of the tensors a captured partition reads is an integer input of it for the same reason;
- a tensor whose size depends on data is only made and read between captured partitions.
Inputs the graph writes into (a KV cache, running statistics) are written by the piece whose nodes write
them: a captured partition copies them back out of its buffers as a whole graph's runner does.

Runs of nodes with no tensor work (views, sizes) are not recorded: they run between the partitions.
Settings that act on the whole graph (`config.check_nans`, `config.debug_sync`) keep CUDA graphs off for
all of it (`runtime/cudagraphs.py`).
"""
from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Callable, Optional

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_symbols, free_unbacked_symbols

from .. import config, metrics
from .cudagraphs import capture_blockers, capture_device_type, own_blockers, static_input_indices, values_of

log = logging.getLogger("ember.cudagraphs")


def node_blockers(n: torch.fx.Node, device_type: str) -> list[str]:
    """Why node `n` cannot be recorded into a CUDA graph on `device_type` as part of a partition: its own
    reasons, and what it reads (empty: it can)."""
    why = own_blockers(n, device_type)
    for a in n.all_input_nodes:
        for v in values_of(a.meta.get("val")):
            if isinstance(v, torch.Tensor) and v.device.type != device_type:
                why.append(f"{n.name} reads {a.name}, a {v.device.type} tensor")
            elif isinstance(v, torch.SymInt) and isinstance(v.node.expr, (sympy.Symbol, sympy.Integer)):
                continue        # an integer input: the partition keeps a recording per value
            elif isinstance(v, (float, torch.SymFloat)):
                why.append(f"{n.name} reads {a.name}, a float a recording would keep")
            elif isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) and \
                    free_unbacked_symbols(v):
                why.append(f"{n.name} reads {a.name}, of a data-dependent value")
    return why


def partition_blockers(gm: torch.fx.GraphModule, device_type: str) -> list[str]:
    """Why a captured partition (compiled: after decomposition and passes) cannot be recorded after all."""
    return [w for n in gm.graph.nodes if n.op == "call_function" for w in node_blockers(n, device_type)]


@dataclasses.dataclass(eq=False)
class Segment:
    """A run of the graph's nodes, in order: recorded into CUDA graphs (`captured`) or run eagerly (`why`
    says what keeps it from being recorded)."""
    nodes: list
    captured: bool
    why: list = dataclasses.field(default_factory=list)
    inputs: list = dataclasses.field(default_factory=list)     # nodes made before it that it reads
    outputs: list = dataclasses.field(default_factory=list)    # its nodes read after it


def _multi_output(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (tuple, list))


def _in_order(gm: torch.fx.GraphModule) -> list:
    """The call_function nodes in graph order, but with each `getitem` of a multi-output op right after the
    op, so that a tuple never crosses from one segment to another."""
    order = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or (n.target is operator.getitem and _multi_output(n.args[0])):
            continue
        order.append(n)
        if _multi_output(n):
            order.extend(u for u in n.users if u.target is operator.getitem)
    return order


def _pure(n: torch.fx.Node) -> bool:
    """Whether moving `n` earlier cannot change what the graph computes: it writes nothing and draws no
    random numbers."""
    if getattr(n.target, "__module__", None) == "_operator":       # getitem, arithmetic on sizes
        return True
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    return not n.target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in n.target.tags


def _hoisted(order: list, blocked: dict) -> list:
    """`order` with the nodes that can be recorded and do not depend on one that cannot moved to the front
    (keeping their order), so that they join one partition instead of being cut apart by a blocker they do
    not read. Nothing moves past an op that writes or draws random numbers."""
    late: set = set()
    barrier = False
    for n in order:
        barrier = barrier or not _pure(n)
        if blocked[n] or barrier or any(a in late for a in n.all_input_nodes):
            late.add(n)
    return [n for n in order if n not in late] + [n for n in order if n in late]


def _does_tensor_work(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and not n.target.is_view and \
        any(isinstance(v, torch.Tensor) for v in values_of(n.meta.get("val")))


def split_segments(gm: torch.fx.GraphModule, device_type: str) -> list[Segment]:
    """The graph's call_function nodes as segments that alternate between captured and not, with the
    values that cross between them."""
    order = _in_order(gm)
    blocked: dict = {}      # node -> why it cannot be recorded; a getitem shares its multi-output op's
    for n in order:
        source = n.args[0] if n.target is operator.getitem and n.args[0] in blocked else n
        blocked[n] = blocked[source] if source is not n else node_blockers(n, device_type)
    runs: list[Segment] = []
    for n in _hoisted(order, blocked):
        why = blocked[n]
        if runs and runs[-1].captured == (not why):
            runs[-1].nodes.append(n)
            runs[-1].why.extend(why)
        else:
            runs.append(Segment([n], not why, list(why)))
    segments: list[Segment] = []
    for s in runs:
        if s.captured and not any(_does_tensor_work(n) for n in s.nodes):
            s.captured = False          # views and sizes alone: nothing worth a recording
        if segments and not s.captured and not segments[-1].captured:
            segments[-1].nodes.extend(s.nodes)
            segments[-1].why.extend(s.why)
        else:
            segments.append(s)
    _connect(gm, segments)
    return segments


def _connect(gm: torch.fx.GraphModule, segments: list) -> None:
    """Fill each segment's inputs and outputs. A captured segment also takes as inputs the integers that
    name the size symbols its values use (a recording is made per value of its integer inputs)."""
    where = {n: k for k, s in enumerate(segments) for n in s.nodes}
    binders: dict = {}      # size symbol -> the first node whose value is that symbol
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            binders.setdefault(v.node.expr, n)
    for k, s in enumerate(segments):
        inputs: dict = {}
        for n in s.nodes:
            for a in n.all_input_nodes:
                if a.op != "get_attr" and where.get(a) != k:
                    inputs[a] = None
        if s.captured:
            # the sizes of what it reads decide the sizes of all it makes
            symbols = set()
            for a in list(inputs):
                for v in values_of(a.meta.get("val")):
                    if isinstance(v, (torch.Tensor, torch.SymInt)):
                        symbols |= free_symbols(v)
            for sym in sorted(symbols, key=str):
                b = binders.get(sym)
                if b is None or where.get(b, -1) >= k:
                    s.captured, s.why = False, [f"no integer input before {s.nodes[0].name} holds size {sym}"]
                    break
                inputs[b] = None
        s.inputs = list(inputs)
    for k, s in enumerate(segments):
        s.outputs = [n for n in s.nodes if any(u.op == "output" or where.get(u) != k for u in n.users)]
        for a in s.inputs:
            if a.op != "placeholder" and a not in segments[where[a]].outputs:
                segments[where[a]].outputs.append(a)


def piece_module(gm: torch.fx.GraphModule, s: Segment) -> torch.fx.GraphModule:
    """Segment `s` as a graph of its own: its inputs are placeholders (named and typed as the values they
    stand for), its outputs a tuple."""
    g = torch.fx.Graph()
    env: dict = {}
    for a in s.inputs:
        env[a] = g.placeholder(a.name)
        env[a].meta.update(a.meta)

    def arg(a: torch.fx.Node):
        if a not in env:        # a get_attr: each piece that reads a constant fetches it itself
            env[a] = g.node_copy(a)
        return env[a]

    for n in s.nodes:
        env[n] = g.node_copy(n, arg)
    g.output(tuple(env[n] for n in s.outputs))
    return torch.fx.GraphModule(gm, g)


@dataclasses.dataclass
class _Step:
    fn: Callable
    inputs: list        # slots read
    release: list       # slots read here for the last time: let go before the call
    outputs: list       # slots written


class PartitionedGraph:
    """Boxed callable (`fn(list_of_inputs) -> tuple`, the list is emptied) that runs a split graph's
    pieces in order. Each value is let go once its last reader has it, so that a recording's outputs
    are held only by the program when its runner next replays."""

    def __init__(self, steps: list, result: list, unused: list):
        self._boxed_call = True
        self.steps, self.result, self.unused = steps, result, unused

    def __call__(self, args):
        values = dict(enumerate(args))
        args.clear()
        for slot in self.unused:
            del values[slot]
        for step in self.steps:
            call_args = [values[slot] for slot in step.inputs]
            for slot in step.release:
                del values[slot]
            outs = step.fn(call_args)
            values.update(zip(step.outputs, outs))
            del outs
        return tuple(values[r] if isinstance(r, int) else r.value for r in self.result)


@dataclasses.dataclass
class _Constant:
    value: object


def _eager(gm: torch.fx.GraphModule) -> Callable:
    def run(args):
        a = list(args)
        args.clear()
        return gm(*a)
    return run


def compile_partitioned(gm: torch.fx.GraphModule, example_inputs: list, kind: str) -> Optional[PartitionedGraph]:
    """The graph split around what cannot be recorded, its captured partitions compiled and recorded; None
    when there is nothing to split (the graph is recorded whole, or runs without CUDA graphs)."""
    device_type = capture_device_type(example_inputs)
    if device_type is None or config.check_nans or config.debug_sync:
        return None
    why = capture_blockers(gm, device_type)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    # the split reads devices and sizes from each value's meta (runtime asserts have none)
    unknown = [n for n in gm.graph.nodes if n.op in ("placeholder", "call_function") and n.users and
               "val" not in n.meta]
    if not why or unknown or not isinstance(output.args[0], (tuple, list)) or \
            any(isinstance(r, torch.fx.Node) and r.op == "get_attr" for r in output.args[0]):
        return None
    segments = split_segments(gm, device_type)
    if not any(s.captured for s in segments):
        return None
    from ..compile_graph import compile_graph
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    slot = {n: i for i, n in enumerate(placeholders)}
    static = set(static_input_indices(gm, kind))
    steps = []
    for s in segments:
        module = piece_module(gm, s)
        if s.captured:
            inputs = [example_inputs[slot[a]] if a.op == "placeholder" else a.meta["val"] for a in s.inputs]
            static_inputs = tuple(k for k, a in enumerate(s.inputs) if a.op == "placeholder" and slot[a] in static)
            fn = compile_graph(module, inputs, is_backward=kind == "backward", is_inference=kind == "inference",
                               cudagraphs=True, static_inputs=static_inputs)
            metrics.cudagraph_partitions += 1
        else:
            log.debug("ember: %s graph: %d nodes from %s on run between CUDA graphs: %s", kind, len(s.nodes),
                      s.nodes[0].name, "; ".join(dict.fromkeys(s.why)) or "no tensor work")
            fn = _eager(module)
        for n in s.outputs:
            slot[n] = len(slot)
        steps.append(_Step(fn, [slot[a] for a in s.inputs], [], [slot[n] for n in s.outputs]))
    result = [slot[r] if isinstance(r, torch.fx.Node) else _Constant(r) for r in values_of(output.args[0])]
    # each slot is let go by the last step that reads it; one no step reads (an input only returned, or
    # not used at all) is kept for the result or let go at once
    last: dict = {}
    for k, step in enumerate(steps):
        for i in step.inputs:
            last[i] = k
    kept = {r for r in result if isinstance(r, int)}
    for i, k in last.items():
        if i not in kept:
            steps[k].release.append(i)
    unused = [i for i in range(len(placeholders)) if i not in last and i not in kept]
    log.debug("ember: %s graph split into %d pieces, %d of them recorded into CUDA graphs", kind,
              len(segments), sum(s.captured for s in segments))
    return PartitionedGraph(steps, result, unused)
