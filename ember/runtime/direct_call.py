"""Calling an inference graph without AOTAutograd's runtime wrapper, when that wrapper has nothing to do.

Every call of a graph that AOTAutograd compiled passes through its runtime wrapper (two `disable` layers,
the wrapper's prologue and epilogue, output-list normalisation): a sizeable share of a one-kernel graph's
host time (docs/performance.md, "Host time per call": `benchmarks/overhead.py --layers`). For an inference graph the
wrapper's work is fixed when the graph is compiled, and its metadata (`ViewAndMutationMeta`) says what it
is. When no input is mutated, no output aliases an input or an intermediate, no tensor subclass, effect
token or functionalized RNG state is involved and the graph's inputs are exactly the ones Dynamo passes,
the wrapper only turns grad mode off around the call (and marks outputs' dynamic dims for Dynamo). ember's
backend then returns `direct(...)`, which does just that and calls ember's compiled graph.

The first call still goes through AOTAutograd's callable (its first-call checks run as before), and so
does any call under autocast of a graph that calls ATen ops (the wrapper keeps autocast away from them).
A graph of ember's kernels alone needs neither grad mode nor autocast handled.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

def _plain(meta) -> bool:
    # a plain tensor's entry in subclass metadata is a PlainTensorMeta (an int before torch 2.6)
    return meta is None or all(isinstance(m, int) or type(m).__name__ == "PlainTensorMeta" for m in meta)


def wrapper_is_trivial(meta, n_placeholders: int, n_dynamo_inputs: int) -> Optional[str]:
    """None when AOTAutograd's inference wrapper would only toggle grad mode around the graph (and mark
    outputs' dynamic dims); otherwise why not. Fields a torch version lacks count against it."""
    from torch._functorch._aot_autograd.schemas import OutputType
    if meta is None:
        return "no AOTAutograd metadata"
    if n_placeholders != n_dynamo_inputs:
        return "the graph's inputs differ from Dynamo's (parameters, deduplicated inputs or tokens)"
    checks = (
        ("an input is mutated", lambda: any(i.mutates_data or i.mutates_metadata for i in meta.input_info)),
        ("an output aliases", lambda: any(o.output_type != OutputType.non_alias for o in meta.output_info)),
        ("intermediate bases", lambda: meta.num_intermediate_bases != 0),
        ("tensor subclasses", lambda: not (_plain(meta.subclass_inp_meta) and _plain(meta.subclass_fw_graph_out_meta))),
        ("effect tokens", lambda: bool(meta.tokens)),
        ("functionalized RNG", lambda: bool(meta.is_rng_op_functionalized)
         or bool(getattr(meta, "num_graphsafe_rng_states", 0))),
        ("grad mode changes", lambda: meta.grad_enabled_mutation is not None),
    )
    for reason, test in checks:
        try:
            if test():
                return reason
        except AttributeError as e:
            return f"metadata field missing ({e})"
    return None


def dynamic_output_dims(meta) -> tuple:
    """((output index, dims), ...) that AOTAutograd's wrapper marks as dynamic on each call's outputs (torch
    2.13 does; 2.11's wrapper marks nothing)."""
    from torch._functorch._aot_autograd import runtime_wrappers
    if not hasattr(runtime_wrappers, "mark_dynamo_propagated_dynamic_indices"):
        return ()
    return tuple((i, frozenset(o.dynamic_dims)) for i, o in enumerate(meta.output_info)
                 if getattr(o, "dynamic_dims", None) is not None)


def _mark_dynamic(outs, dims) -> None:
    for i, d in dims:
        t = outs[i]
        t._dynamo_propagated_dynamic_indices = getattr(t, "_dynamo_propagated_dynamic_indices", set()) | d


def direct(aot_fn: Callable, graph, dims: tuple) -> Callable:
    """A callable with `aot_fn`'s behaviour (Dynamo's unboxed calling convention) that calls `graph` (an
    ember CompiledGraph: boxed, first run checked) itself once its first run went through `aot_fn`."""
    grad_enabled = torch.is_grad_enabled
    set_grad = torch._C._set_grad_enabled
    autocast = torch._C._is_any_autocast_enabled

    def call(*args):
        if not graph.checked or (graph.calls_aten and autocast()):
            return aot_fn(*args)
        if graph.calls_aten and grad_enabled():
            set_grad(False)
            try:
                outs = graph.fn(list(args))
            finally:
                set_grad(True)
        else:
            outs = graph.fn(list(args))
        if dims:
            _mark_dynamic(outs, dims)
        return outs
    return call
