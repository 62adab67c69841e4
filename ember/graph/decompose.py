"""Decompositions: which ATen ops ember rewrites into simpler ATen ops before lowering.

The table starts from PyTorch's core-ATen decompositions, adds the composite ops ember wants broken up
(softmax, layer norm ... become reductions and pointwise ops the scheduler fuses), and removes the ops
ember lowers better itself (var/std by Welford, gelu, silu ...). ATen's `_foreach_*` ops become one op per
list element (graph/foreach.py).

Which overloads of the kept ops ember lowers is the lowering layer's to say: lowering/registry.py
publishes each op it registers here (`publish_lowered`), and ember/compile_graph.py loads every lowering
when ember is imported, so the table is complete whenever it is asked for. graph/ does not import lowering/.

`decompose(gm)` is a graph pass: it re-traces the graph with the table, under the fake mode the graph's
metadata came from, and returns the new graph (unchanged when no node needs decomposing).
"""
from __future__ import annotations

import collections.abc
import functools

import torch
import torch.fx
from torch._decomp import core_aten_decompositions, get_decompositions

from .foreach import foreach_decompositions

aten = torch.ops.aten

_EXTRA = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._softmax_backward_data, aten._log_softmax_backward_data, aten.native_batch_norm,
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.native_group_norm, aten.linear,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.silu_backward,
    aten.sigmoid_backward, aten.tanh_backward, aten.embedding_dense_backward, aten.mse_loss,
    aten.mse_loss_backward, aten.logsumexp, aten.rms_norm, aten._fused_rms_norm,
    aten.native_dropout_backward, aten.hardswish, aten.hardsigmoid, aten.softplus, aten.elu,
    aten.leaky_relu_backward, aten.hardtanh_backward, aten.mish, aten.log_sigmoid_forward,
    aten._batch_norm_with_update, aten._batch_norm_with_update_functional, aten._batch_norm_no_update,
]

# Lowered directly (a better kernel than the decomposition's): keep the overloads ember lowers out of the
# table.
_KEEP = [
    aten.var, aten.var_mean, aten.std, aten.std_mean, aten.gelu, aten.gelu_backward, aten.silu, aten.clamp_min,
    aten.clamp_max,
    aten.clamp, aten.where, aten.hardtanh, aten.full_like, aten.zeros_like, aten.ones_like, aten.arange,
    aten.lerp, aten.addcmul, aten.addcdiv, aten.leaky_relu, aten.nan_to_num, aten.round, aten.rsub,
    aten.upsample_nearest2d, aten._upsample_nearest_exact2d,
]

# The fused attention kernels scaled_dot_product_attention dispatches to (on the CPU, CUDA, cuDNN, or a
# backend's own), and their backwards. Each runs as one ATen call (an extern in the wrapper), never
# decomposed: core ATen's table, written for export, decomposes the CPU flash kernel back into the math form
# (batched matmuls around a softmax), and that decomposition returns the attention weights where the
# kernel's backward expects the logsumexp. SDPA itself stays in the table: its entry runs SDPA's own kernel
# choice for the traced inputs, which picks one of these (or the math form where eager would too).
FUSED_ATTENTION = frozenset(op for op in (
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward,
    getattr(aten, "_scaled_dot_product_fused_attention_overrideable", None),
    getattr(aten, "_scaled_dot_product_fused_attention_overrideable_backward", None),
    aten._flash_attention_forward, aten._flash_attention_backward,
    aten._efficient_attention_forward, aten._efficient_attention_backward) if op is not None)

# Run as ATen calls even with no lowering
_NEVER = sorted(FUSED_ATTENTION, key=str)

# The ATen overloads ember lowers, published by lowering/registry.py as its @lower decorators run
_lowered_ops: set = set()


def publish_lowered(op: torch._ops.OpOverload) -> None:
    """Record that ember lowers `op`: if `op` is one of the kept ops, its decomposition leaves the table."""
    if op in _kept_overloads() and op not in _lowered_ops and decomposition_table.cache_info().currsize:
        raise RuntimeError(f"{op} was lowered after the decomposition table was built: load every lowering "
                           f"(ember.lowering.registry.load_all) before asking for the table")
    _lowered_ops.add(op)


@functools.lru_cache(None)
def _kept_overloads() -> frozenset:
    return frozenset(getattr(op, name) for op in _KEEP for name in op.overloads())


@functools.lru_cache(None)
def decomposition_table() -> dict:
    if not _lowered_ops:
        raise RuntimeError("the decomposition table depends on ember's lowerings: import ember (which loads "
                           "them) before asking for it")
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([op for op in _EXTRA if op is not None]))
    table.update(foreach_decompositions())
    for op in _NEVER:
        for name in op.overloads():
            table.pop(getattr(op, name), None)
    for op in _kept_overloads() & _lowered_ops:
        # a kept op's overloads that ember has no lowering for stay decomposed
        table.pop(op, None)
    return table


class LazyTable(collections.abc.Mapping):
    """decomposition_table(), built at its first use: AOTAutograd reads its decompositions only when it
    traces, which a warm start loading the whole graph from its cache never does (building the table
    imports and scans torch's decompositions). `on_first_use` runs then too: the graph is being compiled."""

    def __init__(self, on_first_use=None):
        self._on_first_use = on_first_use

    def _table(self) -> dict:
        if self._on_first_use is not None:
            first, self._on_first_use = self._on_first_use, None
            first()
        return decomposition_table()

    def __getitem__(self, op):
        return self._table()[op]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


def needs_decomposition(gm: torch.fx.GraphModule) -> bool:
    table = decomposition_table()
    return any(n.op == "call_function" and n.target in table for n in gm.graph.nodes)


def with_traced_device(op, kwargs: dict, val) -> dict:
    """A factory op's kwargs with the device it was traced on where the graph leaves `device` out: ATen
    would read None as the default device (the CPU), but the node's value says where the tensor is. (An
    autograd formula's `at::ones({1}, grad.options())` can reach the graph without its device.)"""
    if kwargs.get("device") is not None or not isinstance(val, torch.Tensor) or not _takes_device(op):
        return kwargs
    return {**kwargs, "device": val.device}


@functools.lru_cache(None)
def _takes_device(op) -> bool:
    return any(a.name == "device" and a.kwarg_only for a in op._schema.arguments)


def pin_factory_devices(gm: torch.fx.GraphModule) -> None:
    """Give every factory node that leaves `device` out the device of its traced value, in place, before
    anything runs or lowers the graph: the decomposition re-trace runs it, and a CPU `ones` next to CUDA
    tensors fails there (seen with cumprod's backward on torch 2.11); lowering reads the kwargs too."""
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            kwargs = with_traced_device(n.target, dict(n.kwargs), n.meta.get("val"))
            if kwargs.keys() != n.kwargs.keys():
                n.kwargs = kwargs
                changed = True
    if changed:
        gm.recompile()


def decompose(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    if not needs_decomposition(gm):
        return gm
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        fake_mode = detect_fake_mode(vals) or detect_fake_mode(example_inputs)
    except AssertionError:
        # placeholders faked by different modes (make_fx in real mode gives each its own): fake the
        # example inputs afresh instead
        fake_mode = None
    if fake_mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        vals = [fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in example_inputs]
    with fake_mode:
        new = make_fx(torch.fx.Interpreter(gm).run, decomposition_table=decomposition_table(),
                      tracing_mode="real", _allow_non_fake_inputs=True)(*vals)
    return new
