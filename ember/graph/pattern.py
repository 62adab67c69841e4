"""Declarative graph rewrites: write the subgraph to find and its replacement as plain PyTorch functions.

    from ember.graph.pattern import Pattern, register_replacement

    def search(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def replace(x, w):
        return torch.ops.mylib.rms_norm(x, w, 1e-6)

    rms = Pattern(search, replace, [torch.randn(8, 16), torch.randn(16)])
    with ember.config.patch(post_grad_passes=[rms]): ...         # a Pattern is an FX pass
    rms.apply(gm)                                                 # or run it yourself: -> replacements made

Both functions are traced once, lazily, to ATen graphs with ember's own decomposition table, so the
search graph has the same ops as the graphs it is matched against (the post-grad graph and AOTAutograd's
joint graph both went through that table). `trace="torch"` traces with torch.fx.symbolic_trace instead,
for Dynamo's torch-level graph (pre-grad passes). The example inputs only steer tracing: any shapes and
dtypes for which the functions trace to the same ops work. Matching is torch.fx's SubgraphMatcher:

  - the two functions take the same inputs, in the same order; each input matches any graph value;
  - literals (1e-6, dim -1, sizes baked in by a reshape) must be equal unless `ignore_literals=True`;
  - a match is skipped when a value inside it is used outside it (the rewrite would drop that value);
  - `extra_check(inputs)` gets {input name: matched fx.Node} and can veto a match (dtype, shape ...).

New nodes get `meta["val"]` from their fake implementations, because lowering reads output layouts from
it: a custom op in a replacement needs a fake (meta) implementation, and runs as an ATen fallback.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

import torch
import torch.fx
from torch.fx.subgraph_rewriter import replace_pattern_with_filters


class Pattern:
    def __init__(self, search_fn: Callable, replace_fn: Callable, example_inputs: Sequence, *,
                 trace: str = "aten", ignore_literals: bool = False,
                 extra_check: Optional[Callable[[dict], bool]] = None, name: Optional[str] = None):
        if trace not in ("aten", "torch"):
            raise ValueError(f"Pattern(trace={trace!r}): use 'aten' (post-grad, joint) or 'torch' (pre-grad)")
        self.search_fn, self.replace_fn = search_fn, replace_fn
        self.example_inputs = list(example_inputs)
        self.trace, self.ignore_literals, self.extra_check = trace, ignore_literals, extra_check
        self.name = name or getattr(search_fn, "__name__", "pattern")
        self.count = 0                          # replacements made over this pattern's lifetime
        self._graphs: Optional[tuple] = None

    def __repr__(self):
        return f"Pattern({self.name}, replaced {self.count}x)"

    # a Pattern is an FX pass: ember.config.post_grad_passes=[pattern]
    def __call__(self, gm: torch.fx.GraphModule) -> None:
        self.apply(gm)

    @property
    def search_graph(self) -> torch.fx.GraphModule:
        return self._traced()[0]

    @property
    def replace_graph(self) -> torch.fx.GraphModule:
        return self._traced()[1]

    def apply(self, gm: torch.fx.GraphModule) -> int:
        """Replace every non-overlapping match in gm, in place. Returns how many were replaced."""
        search, replace = self._traced()
        filters = [self._filter] if self.extra_check is not None else []
        from torch.utils._python_dispatch import _disable_current_modes
        # the rewriter deep-copies the replacement's constants, which an active fake mode would intercept
        with _disable_current_modes():
            replaced = replace_pattern_with_filters(gm, search, replace, match_filters=filters,
                                                    ignore_literals=self.ignore_literals)
        if replaced:
            _fill_meta(gm, [n for r in replaced for n in r.replacements])
            gm.graph.lint()
            gm.recompile()
        self.count += len(replaced)
        return len(replaced)

    # -- internals ------------------------------------------------------------------------------------------

    def _filter(self, match, original_graph, pattern_graph) -> bool:
        phs = [n for n in pattern_graph.nodes if n.op == "placeholder"]
        inputs = {n.name: match.nodes_map[n] for n in phs if n in match.nodes_map}
        return bool(self.extra_check(inputs))

    def _traced(self) -> tuple:
        if self._graphs is None:
            from torch._guards import tracing
            from torch.utils._python_dispatch import _disable_current_modes
            # first used inside a compile: trace in a clean state, not under the caller's fake mode
            with _disable_current_modes(), tracing(None):
                graphs = (self._trace_fn(self.search_fn, True), self._trace_fn(self.replace_fn, False))
            n_search, n_replace = (len(_placeholders(g)) for g in graphs)
            if n_search != n_replace:
                raise ValueError(f"pattern {self.name}: the search function takes {n_search} inputs and the "
                                 f"replacement {n_replace}; they must take the same inputs")
            self._graphs = graphs
        return self._graphs

    def _trace_fn(self, fn: Callable, is_search: bool) -> torch.fx.GraphModule:
        try:
            if self.trace == "torch":
                gm = torch.fx.symbolic_trace(fn)
            else:
                from torch.fx.experimental.proxy_tensor import make_fx
                from .decompose import decomposition_table
                # fake tracing: custom ops in a replacement only need their fake implementation here
                gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*self.example_inputs)
        except Exception as e:
            raise ValueError(f"pattern {self.name}: tracing {getattr(fn, '__name__', fn)} on the example inputs "
                             f"failed ({type(e).__name__}: {e}); the search and replacement functions must "
                             f"take the same inputs") from e
        params = [p for p in inspect.signature(fn).parameters]
        for node, pname in zip(_placeholders(gm), params):
            node._rename(pname)         # extra_check sees the function's own argument names
        for node in gm.graph.nodes if is_search else ():
            # an unused input would match nothing; the replacement may ignore inputs
            if node.op == "placeholder" and not node.users:
                raise ValueError(f"pattern {self.name}: input {node.name!r} of {fn.__name__} is unused; "
                                 f"a pattern input must appear in the graph (use a literal for constants)")
        gm.graph.eliminate_dead_code()
        gm.recompile()
        return gm


def register_replacement(search_fn: Callable, replace_fn: Callable, example_inputs: Sequence, pass_list: list,
                         **kwargs) -> Pattern:
    """Build a Pattern and append it to a pass list, e.g. `ember.config.post_grad_passes`."""
    pattern = Pattern(search_fn, replace_fn, example_inputs, **kwargs)
    pass_list.append(pattern)
    return pattern


def apply_patterns(gm: torch.fx.GraphModule, patterns: Sequence[Pattern]) -> int:
    """Run patterns in order until none matches any more (a replacement may expose another match)."""
    total = 0
    for _ in range(8):
        made = sum(p.apply(gm) for p in patterns)
        total += made
        if not made:
            break
    return total


def _placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _fill_meta(gm: torch.fx.GraphModule, new_nodes: list) -> None:
    """Give replacement nodes the fake values lowering reads output layouts from, by running them on their
    inputs' fake values under those values' fake mode. ATen graphs keep them in meta["val"], Dynamo's graph
    in meta["example_value"]; a node whose inputs have neither is left without (AOTAutograd re-traces)."""
    from torch._subclasses.fake_tensor import FakeTensor
    pending = set(new_nodes)
    for n in pending:
        # copied from the replacement's own trace: right ops, but the example inputs' shapes
        for key in ("val", "tensor_meta", "example_value"):
            n.meta.pop(key, None)
    ph_vals = [n.meta.get("val", n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder"]
    graph_mode = next((v.fake_mode for v in ph_vals if isinstance(v, FakeTensor)), None)
    for node in gm.graph.nodes:          # graph order: each node's inputs are filled before it
        if node not in pending:
            continue
        if node.op == "get_attr" and graph_mode is not None:
            value = getattr(gm, node.target)
            key = "val" if any("val" in n.meta for n in gm.graph.nodes if n.op == "placeholder") else "example_value"
            node.meta[key] = graph_mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
            continue
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        key = next((k for k in ("val", "example_value") if all(k in a.meta for a in inputs)), None)
        if key is None:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta[key])
        # the mode the values came from: Dynamo hands backends a different mode than its graph's values'
        modes = [v.fake_mode for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, FakeTensor)]
        if not modes:
            continue
        with modes[0]:
            node.meta[key] = node.target(*args, **kwargs)
