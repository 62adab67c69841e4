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
for Dynamo's torch-level graph (pre-grad passes), and `trace="joint"` traces a function's forward and its
backward as AOTAutograd's joint graph, for joint passes (inputs: the function's tensor inputs, then one
tangent per output, named tangent_0 ...; outputs: the function's outputs, then each input's gradient). The
example inputs only steer tracing: any shapes and dtypes for which the functions trace to the same ops
work. Matching is torch.fx's SubgraphMatcher:

  - the two functions take the same inputs, in the same order; each input matches any graph value;
  - an input whose example is not a tensor (an int, a float, a dtype ...) is a literal input: it stands
    for the literal wherever its example value appears in the traced functions, matches any literal
    there (the same one at every place), and the replacement gets the matched literal;
  - other literals (1e-6, dim -1, sizes baked in by a reshape) must be equal unless `ignore_literals=True`;
  - the search function may return several values (a tuple): each is replaced by the replacement's
    value at the same position, and may be read outside the match;
  - a match is skipped when a value inside it, not returned, is used outside it (the rewrite would drop
    that value);
  - `extra_check(match)` can veto a match (dtype, shape, who reads the result ...): `match` is a `Match`,
    {input name: the graph node, or literal, it matched}, whose `outputs` are the graph nodes the search
    function's return values matched and `nodes` the graph nodes every op of the search graph matched.

`replace_fn=None` makes a pattern that only finds: `pattern.matches(gm)` lists the matches for a pass that
builds each replacement from what it matched (graph/passes/attention.py).

New nodes get `meta["val"]` from their fake implementations (`fill_fake_values`), because lowering reads
output layouts from it: a custom op in a replacement needs a fake (meta) implementation, and runs as an
ATen fallback unless ember lowers it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from .decompose import decomposition_table


class Match(dict):
    """What `extra_check` sees of one match: {input name: the graph node it matched, or the literal for a
    literal input}; `outputs`, the graph nodes the search function's return values matched; `nodes`, {name
    of an op node of the search graph: the graph node it matched}."""

    def __init__(self, inputs: dict, outputs: list, nodes: Optional[dict] = None):
        super().__init__(inputs)
        self.outputs = outputs
        self.nodes = nodes or {}


class Pattern:
    def __init__(self, search_fn: Callable, replace_fn: Optional[Callable], example_inputs: Sequence, *,
                 trace: str = "aten", ignore_literals: bool = False,
                 extra_check: Optional[Callable[[Match], bool]] = None, name: Optional[str] = None):
        if trace not in ("aten", "torch", "joint"):
            raise ValueError(f"Pattern(trace={trace!r}): use 'aten' (post-grad, joint), 'joint' (a forward and "
                             f"its backward, joint) or 'torch' (pre-grad)")
        self.search_fn, self.replace_fn = search_fn, replace_fn
        self.example_inputs = list(example_inputs)
        self.trace, self.ignore_literals, self.extra_check = trace, ignore_literals, extra_check
        self.name = name or getattr(search_fn, "__name__", "pattern")
        self.count = 0                          # replacements made over this pattern's lifetime
        self._graphs: Optional[tuple] = None

    def __repr__(self):
        return f"Pattern({self.name}, replaced {self.count}x)"

    # a Pattern is an FX pass: ember.config.post_grad_passes=[pattern] (the pass runner recompiles gm)
    def __call__(self, gm: torch.fx.GraphModule) -> None:
        self._rewrite(gm)

    @property
    def search_graph(self) -> torch.fx.GraphModule:
        return self._traced()[0]

    @property
    def replace_graph(self) -> torch.fx.GraphModule:
        return self._traced()[1]

    def apply(self, gm: torch.fx.GraphModule) -> int:
        """Replace every non-overlapping match in gm, in place. Returns how many were replaced."""
        if self.replace_fn is None:
            raise ValueError(f"pattern {self.name} has no replacement: use matches(gm)")
        replaced = self._rewrite(gm)
        if replaced:
            gm.graph.lint()
            gm.recompile()
        return replaced

    def matches(self, gm: torch.fx.GraphModule) -> list:
        """The non-overlapping matches in gm that extra_check accepts, as `Match`es; gm is left as it is."""
        search = self._traced()[0]
        found = _Matcher(search.graph, self._accepts, self.ignore_literals).matches(gm.graph)
        return [_match_of(m.nodes_map, m.returning_nodes) for m in found]

    # -- internals ------------------------------------------------------------------------------------------

    def _rewrite(self, gm: torch.fx.GraphModule) -> int:
        search, replace = self._traced()
        matches = _Matcher(search.graph, self._accepts, self.ignore_literals).matches(gm.graph)
        replaced: dict = {}         # a value an earlier match returned -> the value that replaced it
        new_nodes = []
        for m in matches:
            new_nodes += _splice(gm, m, search, replace, replaced)
        fill_fake_values(gm, new_nodes)
        self.count += len(matches)
        return len(matches)

    def _accepts(self, nodes_map: dict, returned: list) -> bool:
        if self.extra_check is None:
            return True
        return bool(self.extra_check(_match_of(nodes_map, returned)))

    def _traced(self) -> tuple:
        if self._graphs is None:
            from torch._guards import tracing
            from torch.utils._python_dispatch import _disable_current_modes
            # first used inside a compile: trace in a clean state, not under the caller's fake mode
            with _disable_current_modes(), tracing(None):
                graphs = (self._trace_fn(self.search_fn, True),
                          None if self.replace_fn is None else self._trace_fn(self.replace_fn, False))
            n_search, n_replace = (len(_placeholders(g)) if g is not None else None for g in graphs)
            if n_replace is not None and n_search != n_replace:
                raise ValueError(f"pattern {self.name}: the search function takes {n_search} inputs and the "
                                 f"replacement {n_replace}; they must take the same inputs")
            self._graphs = graphs
        return self._graphs

    def _trace_fn(self, fn: Callable, is_search: bool) -> torch.fx.GraphModule:
        try:
            if self.trace == "torch":
                gm = torch.fx.symbolic_trace(fn)
            elif self.trace == "joint":
                gm = _trace_joint(fn, self.example_inputs)
            else:
                from torch.fx.experimental.proxy_tensor import make_fx
                # fake tracing: custom ops in a replacement only need their fake implementation here
                gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*self.example_inputs)
        except Exception as e:
            raise ValueError(f"pattern {self.name}: tracing {getattr(fn, '__name__', fn)} on the example inputs "
                             f"failed ({type(e).__name__}: {e}); the search and replacement functions must "
                             f"take the same inputs") from e
        params = [p for p in inspect.signature(fn).parameters]
        placeholders = _placeholders(gm)
        if self.trace == "joint":
            params += [f"tangent_{i}" for i in range(len(placeholders) - len(params))]
        for node, pname in zip(placeholders, params):
            node._rename(pname)         # extra_check sees the function's own argument names
        if self.trace == "aten":
            self._bind_literal_inputs(gm, placeholders, fn if is_search else None)
        for node in placeholders if is_search else ():
            # an unused input would match nothing; the replacement may ignore inputs
            if not node.users:
                raise ValueError(f"pattern {self.name}: input {node.name!r} of {fn.__name__} is unused; "
                                 f"a pattern input must appear in the graph (use a literal for constants)")
        gm.graph.eliminate_dead_code()
        gm.recompile()
        return gm

    def _bind_literal_inputs(self, gm: torch.fx.GraphModule, placeholders: list, search_fn) -> None:
        """Make each literal input's placeholder stand where tracing baked its example value in."""
        literals = {ph: v for ph, v in zip(placeholders, self.example_inputs) if not isinstance(v, torch.Tensor)}
        values = list(literals.values())
        if any(_same_literal(a, b) for i, a in enumerate(values) for b in values[i + 1:]):
            raise ValueError(f"pattern {self.name}: literal inputs need distinct example values "
                             f"(each stands for its own literal), got {values}")
        for ph, value in literals.items():
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    node.args, node.kwargs = _put_placeholder((node.args, node.kwargs), value, ph)
            if search_fn is not None and not ph.users:
                raise ValueError(f"pattern {self.name}: the literal input {ph.name!r} = {value!r} of "
                                 f"{search_fn.__name__} appears as no op's argument")


class _Matcher(SubgraphMatcher):
    """torch.fx's SubgraphMatcher that asks the pattern's extra_check about each match as it checks that
    the match's inner values are not used outside it: before its cycle check, a walk of the graph below
    each match, which most candidates of ember's own patterns would pay for nothing."""

    def __init__(self, search: torch.fx.Graph, accepts: Callable[[dict, list], bool], ignore_literals: bool):
        super().__init__(search, match_output=False, match_placeholder=False, remove_overlapping_matches=True,
                         ignore_literals=ignore_literals)
        self._accepts = accepts
        self._inner = [n for n in search.nodes if n.op not in ("placeholder", "output")]
        self._verdicts: dict = {}       # matched graph nodes -> extra_check's answer (asked once a match)

    def matches(self, graph: torch.fx.Graph) -> list:
        # asked again here: the veto must hold whether or not match() goes through _is_contained
        return [m for m in self.match(graph) if self._accepted(m.nodes_map)]

    def _is_contained(self, nodes_map: dict) -> bool:
        return super()._is_contained(nodes_map) and self._accepted(nodes_map)

    def _accepted(self, nodes_map: dict) -> bool:
        key = tuple(nodes_map[n] for n in self._inner)
        if key not in self._verdicts:
            self._verdicts[key] = self._accepts(nodes_map, [nodes_map[n] for n in self.pattern_returning_nodes])
        return self._verdicts[key]


def _match_of(nodes_map: dict, returned: list) -> Match:
    inputs = {n.name: v for n, v in nodes_map.items() if n.op == "placeholder"}
    inner = {n.name: v for n, v in nodes_map.items() if n.op not in ("placeholder", "output")}
    return Match(inputs, returned, inner)


def _trace_joint(fn: Callable, example_inputs: Sequence) -> torch.fx.GraphModule:
    """fn's forward and backward as AOTAutograd's joint graph, with ember's decompositions: placeholders
    are fn's inputs then one tangent per output; outputs are fn's outputs then the inputs' gradients."""
    from torch._functorch.aot_autograd import aot_export_joint_simple
    if not all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in example_inputs):
        raise ValueError("trace='joint' takes floating tensor inputs only")
    inputs = [x.detach().clone().requires_grad_(True) for x in example_inputs]

    def as_tuple(*args):
        out = fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    with torch.enable_grad():        # first traced inside a compile, which may run without grad
        gm = aot_export_joint_simple(as_tuple, inputs, trace_joint=True, decompositions=decomposition_table())
    gm.graph._codegen = torch.fx.graph.CodeGen()
    # metadata asserts (from `.to(...)`) anchor nothing a match could need
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    flat = torch.utils._pytree.tree_leaves(out.args[0])     # the joint graph returns (outputs, gradients)
    out.args = (tuple(flat),)
    return gm


def _same_literal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b          # type first: True == 1, but a keepdim is not a dim


def _put_placeholder(args: Any, value: Any, placeholder: torch.fx.Node) -> Any:
    """args (nested lists, tuples and dicts) with every literal equal to `value` replaced by `placeholder`."""
    if isinstance(args, (list, tuple)):
        return type(args)(_put_placeholder(a, value, placeholder) for a in args)
    if isinstance(args, dict):
        return {k: _put_placeholder(a, value, placeholder) for k, a in args.items()}
    return placeholder if not isinstance(args, torch.fx.Node) and _same_literal(args, value) else args


def _splice(gm: torch.fx.GraphModule, match: InternalMatch, search: torch.fx.GraphModule,
            replace: torch.fx.GraphModule, replaced: dict) -> list:
    """Put a copy of the replacement graph in place of one match; returns the nodes added. `replaced` maps
    the values earlier matches returned to their replacements (a later match may read them)."""
    graph = gm.graph
    trace = next((n.meta["stack_trace"] for n in match.returning_nodes if n.meta.get("stack_trace")), None)
    inputs = [replaced.get(v, v) if isinstance(v, torch.fx.Node) else v for v in match.placeholder_nodes]
    val_map = dict(zip(_placeholders(replace), inputs))
    # before the first reader of a returned value: every input of the match is defined by then
    readers = [u for n in match.returning_nodes for u in n.users]
    where = min(readers) if readers else max(match.returning_nodes).next
    with graph.inserting_before(where):
        outputs = graph.graph_copy(replace.graph, val_map)
    outputs = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
    for old, new in zip(match.returning_nodes, outputs):
        old.replace_all_uses_with(new)
        replaced[old] = new
    for node in reversed(search.graph.nodes):
        if node.op not in ("placeholder", "output"):
            graph.erase_node(match.nodes_map[node])
    new_nodes = [n for p, n in val_map.items() if p.op != "placeholder"]
    # the user's source line of what was replaced stays with its replacement (error messages, debug dumps)
    for n in new_nodes:
        if trace is not None:
            n.meta.setdefault("stack_trace", trace)
    _copy_constants(gm, replace, new_nodes)
    return new_nodes


def _copy_constants(gm: torch.fx.GraphModule, replace: torch.fx.GraphModule, new_nodes: list) -> None:
    """Give gm the replacement's constant tensors that the copied nodes read, each under a name of its own
    in gm (the graph's own constants may have the same names)."""
    for node in new_nodes:
        if node.op != "get_attr":
            continue
        value = getattr(replace, node.target)
        name = next((k for k, v in gm.__dict__.items() if v is value), None) or _free_name(gm, node.target)
        setattr(gm, name, value)
        node.target = name


def _free_name(gm: torch.fx.GraphModule, base: str) -> str:
    i = 0
    while hasattr(gm, f"{base}_{i}"):
        i += 1
    return f"{base}_{i}"


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


def fill_fake_values(gm: torch.fx.GraphModule, new_nodes: list) -> None:
    """Give replacement nodes the fake values lowering reads output layouts from, by running them on their
    inputs' fake values under those values' fake mode. ATen graphs keep them in meta["val"], Dynamo's graph
    in meta["example_value"]; a node whose inputs have neither is left without (AOTAutograd re-traces)."""
    from torch._subclasses.fake_tensor import FakeTensor
    if not new_nodes:
        return
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
