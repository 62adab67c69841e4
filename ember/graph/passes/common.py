"""Running a named list of FX passes, built-in then the user's (from ember.config); what passes and the
lowering share about ATen ops."""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.fx

aten = torch.ops.aten

# ATen ops whose result is a view of their first argument
VIEW_OPS = frozenset({
    aten.slice.Tensor, aten.select.int, aten.permute.default, aten.transpose.int, aten.t.default,
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.alias.default})

# views through which a value's elements keep their order (a pointwise reader behind them reads the
# same elements): what passes and the product lowering look through to find a value's readers
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def readers(node: torch.fx.Node, through=RESHAPES) -> list:
    """The nodes that read node, directly or through views whose op is in `through` (the views left out)."""
    out = []
    for u in node.users:
        out += readers(u, through) if u.op == "call_function" and u.target in through else [u]
    return out


def depends_on_tangents(gm: torch.fx.GraphModule) -> set:
    """The nodes of a joint forward+backward graph that depend on a tangent: the backward's."""
    seen = set()
    for n in gm.graph.nodes:
        if (n.op == "placeholder" and "tangents" in str(n.target)) or any(a in seen for a in n.all_input_nodes):
            seen.add(n)
    return seen


def forward_nodes(gm: torch.fx.GraphModule, output: torch.fx.Node, backward: set) -> set:
    """The nodes some forward result depends on: a forward output (in a joint graph, an output that
    depends on no tangent; a gradient that does not either only makes this set larger) or a forward side
    effect (the copy_ that updates BatchNorm's running statistics)."""
    roots = [a for a in output.all_input_nodes if a not in backward]
    roots += [n for n in gm.graph.nodes if n.op == "call_function" and not n.users and n.is_impure()
              and n not in backward]
    stack, seen = roots, set()
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def is_pointwise(node: torch.fx.Node) -> bool:
    """Is node an elementwise op (ATen's pointwise tag)?"""
    return node.op == "call_function" and torch.Tag.pointwise in getattr(node.target, "tags", ())


def returns_fresh_memory(op) -> bool:
    """Per the op's schema, none of its results is a view of an argument (`Tensor(a)`). Ops with no schema
    (higher-order ops) are not known to."""
    schema = getattr(op, "_schema", None)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


def only_allocates(op) -> bool:
    """Per the op's schema, its results are new tensors and it writes none of its arguments."""
    return returns_fresh_memory(op) and \
        not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def call_op(graph: torch.fx.Graph, op, *args, **kwargs) -> torch.fx.Node:
    """A new node op(*args, **kwargs) at the graph's insertion point, with its fake value."""
    node = graph.call_function(op, args, kwargs)
    fake = next(x.meta["val"] for x in args if isinstance(x, torch.fx.Node))
    with fake.fake_mode:
        node.meta["val"] = op(*[x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args], **kwargs)
    return node


def size_arg(graph: torch.fx.Graph, node: torch.fx.Node, dim: int):
    """node's size along dim as a new node's argument: an int, or for a symbolic size an `aten.sym_size.int`
    node at the insertion point (a SymInt itself has no value when the graph runs)."""
    size = node.meta["val"].shape[dim]
    if not isinstance(size, torch.SymInt):
        return int(size)
    read = graph.call_function(aten.sym_size.int, (node, dim))
    read.meta["val"] = size
    return read


def run_passes(gm: torch.fx.GraphModule, passes: Iterable[Callable], user_passes: Iterable[Callable]) -> torch.fx.GraphModule:
    for p in list(passes) + list(user_passes):
        out = p(gm)
        if isinstance(out, torch.fx.GraphModule):
            gm = out
    gm.graph.lint()
    gm.recompile()
    return gm


def dead_code_elimination(gm: torch.fx.GraphModule) -> None:
    gm.graph.eliminate_dead_code()
