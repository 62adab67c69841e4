"""ATen fallbacks: an op with no lowering becomes an ExternKernel, a call to ATen from the wrapper.

Tensor arguments are realized (stored) first, with the strides eager gives them where those are dense
(the FX node's fake tensor), so the ATen op sees what it would see eagerly. The output's layout is what
the op really returns for the layouts its inputs really have: the op is run on meta tensors with those
layouts (an output's strides may follow its input's, e.g. sort or flip of a transposed tensor); where
that cannot be done (symbolic sizes, no meta kernel) it is the fake tensor's. A tuple result becomes one
MultiOutput buffer per tensor.
"""
from __future__ import annotations

import sympy
import torch
import torch.fx

from .. import metrics, state
from ..ir.nodes import (Buffer, ComputedBuffer, ExternKernel, Layout, Loops, MultiOutput, Pointwise, ReinterpretView,
                        TensorBox)
from ..ir.symbolic import hint, sympify
from .layouts import is_dense, same_shape
from .views import stored_view

aten = torch.ops.aten


def realize_arg(a, meta=None):
    """Store a when it is not stored yet, in the layout eager would hand the op: `meta`'s (its fake
    tensor's) strides where those are dense, else dense in `meta`'s dimension order. Kernels such as cuDNN
    attention pick their output layout from their inputs' strides, and their meta functions assume
    eager's; a contiguous copy of a permuted input would make the two disagree."""
    if isinstance(a, TensorBox):
        if isinstance(a.data, Loops) and same_shape(meta, a):
            stride = [sympify(s) for s in meta.stride()] if is_dense(meta) else _dense_strides_like(meta, a)
            view = stored_view(a, stride)
            if view is not None:
                a.data = view
                return view
            store_dense(a, stride)
        return a.realize()
    if isinstance(a, (list, tuple)):
        metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(a) else [None] * len(a)
        return type(a)(realize_arg(b, m) for b, m in zip(a, metas))
    return a


def store_dense(box: TensorBox, stride: list) -> None:
    """Store a computed value with these dense strides: a Pointwise whose strides order its dims otherwise
    than row-major (channels-last) by a kernel that walks memory in order (_store_in_memory_order)."""
    order = _permuted_order(list(box.get_size()), stride) if isinstance(box.data, Pointwise) else None
    if order is None:
        state.current_graph().store_with_strides(box, stride)
    else:
        _store_in_memory_order(box, stride, order)


def _permuted_order(sizes: list, stride: list):
    """The dims from outermost to innermost where `stride` is a dense layout of `sizes` in another order
    than theirs (a transposed weight for mm), else None. Static sizes only."""
    if not all(isinstance(x, sympy.Integer) for x in (*sizes, *stride)):
        return None
    big = [d for d in range(len(sizes)) if sizes[d] != 1]
    order = sorted(big, key=lambda d: -int(stride[d]))
    step = 1
    for d in reversed(order):
        if stride[d] != step:
            return None
        step *= int(sizes[d])
    return order if order != big else None


def _store_in_memory_order(box: TensorBox, stride: list, order: list) -> None:
    """Store a Pointwise with a permuted layout by a kernel that walks memory in order: it computes the
    permuted tensor contiguously and the value becomes a view of it. Walking the value's own dims instead
    writes (and usually reads) with a stride, far below the copy bandwidth (padding GPT-2's 50257 x 768
    tied weight for the LM head's transposed operand: docs/performance.md)."""
    sizes, pw = list(box.get_size()), box.data

    def in_memory_order(idx):
        logical = [sympy.Integer(0)] * len(sizes)
        for d, i in zip(order, idx):
            logical[d] = i
        return pw.inner_fn(logical)
    mem_sizes = [sizes[d] for d in order]
    buf = state.current_graph().register_buffer(ComputedBuffer(
        None, Layout.contiguous(pw.device, pw.dtype, mem_sizes), Pointwise(pw.device, pw.dtype, in_memory_order,
                                                                              mem_sizes)))
    box.data = ReinterpretView(buf, Layout(pw.device, pw.dtype, sizes, stride))


def _dense_strides_like(meta, box) -> list:
    """Contiguous strides for `box`'s sizes with the dimension order of `meta`'s strides (innermost =
    smallest stride; ties keep the later dimension inner; broadcast dims, stride 0, outermost). Hints only
    choose the order, which is valid for every size, so no guard is needed."""
    sizes = list(box.get_size())

    def key(d):
        st = hint(sympify(meta.stride()[d]))
        return (st if st else float("inf"), -d)
    order = sorted(range(len(sizes)), key=key)
    stride, step = [None] * len(sizes), sympify(1)
    for d in order:
        stride[d] = step
        step = step * sizes[d]
    return stride


def _meta_of(a):
    if isinstance(a, torch.fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_of(b) for b in a)
    return None


def _mutated_args(op, args, kwargs) -> list:
    """Buffers an op writes into (schema args marked `Tensor(a!)`)."""
    out = []
    schema = op._schema
    for i, sa in enumerate(schema.arguments):
        if sa.alias_info is None or not sa.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(sa.name)
        if isinstance(v, TensorBox):
            out.append(v)
    return out


def fallback(op, args, kwargs, node: torch.fx.Node):
    metrics.fallbacks[str(op)] += 1
    return extern_call(op, args, kwargs, node)


def extern_call(op, args, kwargs, node: torch.fx.Node, build=ExternKernel):
    """The op as an extern call from the wrapper. `build(name, layout, op, args, kwargs, mutated)` makes
    its IR node: an ExternKernel, or a subclass of it (a collective: lowering/collectives.py)."""
    g = state.current_graph()
    mutated = _mutated_args(op, args, kwargs)
    for m in mutated:
        if not m.is_realized() or isinstance(m.data, ReinterpretView):
            raise NotImplementedError(f"{op} mutates a value that is not a stored buffer")
    arg_metas = _meta_of(list(node.args)) if node is not None else []
    if len(arg_metas) != len(args):
        arg_metas = [None] * len(args)
    ir_args = [realize_arg(a, m) for a, m in zip(args, arg_metas)]
    ir_kwargs = {k: realize_arg(v, _meta_of(node.kwargs.get(k)) if node is not None else None)
                 for k, v in kwargs.items()}
    val = node.meta.get("val") if node is not None else None
    spec = _layouts(val, _run_on_meta(op, ir_args, ir_kwargs))
    mutated_names = [m.data.get_name() for m in mutated]
    if isinstance(spec, Layout):
        return TensorBox(g.register_buffer(build(None, spec, op, ir_args, ir_kwargs, mutated_names)))
    kernel = g.register_buffer(build(None, None, op, ir_args, ir_kwargs, mutated_names))
    if isinstance(spec, (list, tuple)):
        return _multi_outputs(g, kernel, spec, ())
    return None


def _fake_tensor(x):
    """A fake tensor on x's device with the IR node's layout (TypeError where a size is symbolic)."""
    l = x.layout
    size, stride, offset = [int(s) for s in l.size], [int(s) for s in l.stride], int(l.offset)
    extent = offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1 if all(size) else offset
    return torch.empty(max(extent, 1), dtype=l.dtype, device=l.device).as_strided(size, stride, offset)


_fake_modes: list = []


def _fake_mode():
    """The fake mode the meta runs use: one for the process, as making a mode records a stack trace and
    a graph runs hundreds of fallbacks."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    if not _fake_modes:
        _fake_modes.append(FakeTensorMode(allow_non_fake_inputs=True))
    return _fake_modes[0]


# _run_on_meta's answers by op and arguments (their layouts, for tensors): the same layer repeated asks the
# same question, and each asks the fake mode to build its inputs and dispatch the op
_meta_runs: dict = {}
_META_RUNS_MAX = 1 << 14


class _Unkeyable(Exception):
    pass


def _meta_key(a):
    if isinstance(a, (Buffer, ReinterpretView)):
        if a.layout is None:
            raise _Unkeyable
        l = a.layout
        return ("t", l.device, l.dtype, tuple(l.size), tuple(l.stride), l.offset)
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_meta_key(b) for b in a))
    if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format, sympy.Basic)):
        return (type(a), a)
    raise _Unkeyable


def _run_on_meta(op, ir_args, ir_kwargs):
    """The op's outputs for fake inputs with the layouts its inputs really have (None if it can't run)."""
    try:
        key = (op, torch.get_default_dtype(), _meta_key(list(ir_args)),
               tuple((k, _meta_key(v)) for k, v in ir_kwargs.items()))
        hash(key)
    except (_Unkeyable, TypeError):
        return _meta_run(op, ir_args, ir_kwargs)
    if key not in _meta_runs:
        if len(_meta_runs) >= _META_RUNS_MAX:
            _meta_runs.clear()
        _meta_runs[key] = _meta_run(op, ir_args, ir_kwargs)
    return _meta_runs[key]


def _meta_run(op, ir_args, ir_kwargs):
    """Fake tensors on the real device, not meta-device tensors: some meta functions choose strides by
    device (LAPACK's column-major results on CPU)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    found = []

    def convert(a):
        if isinstance(a, (Buffer, ReinterpretView)) and a.layout is not None:
            found.append(a)
            return _fake_tensor(a)
        if isinstance(a, (list, tuple)):
            return type(a)(convert(b) for b in a)
        return a

    try:
        with unset_fake_temporarily(), _fake_mode():
            margs = [convert(a) for a in ir_args]
            mkwargs = {k: convert(v) for k, v in ir_kwargs.items()}
            return op(*margs, **mkwargs) if found else None
    except Exception:
        return None


def _layouts(val, out):
    """`val` (the node's fake outputs) with each tensor replaced by its Layout: the fake tensor's, with the
    strides and offset of `out` (the meta run) where that ran and agrees on the size."""
    if isinstance(val, torch.Tensor):
        layout = Layout.from_tensor(val)
        if _is_fake(out) and [sympify(s) for s in out.shape] == list(layout.size):
            layout = Layout(layout.device, layout.dtype, layout.size, [sympify(s) for s in out.stride()],
                            sympify(out.storage_offset()))
        return layout
    if isinstance(val, (list, tuple)):
        outs = out if isinstance(out, (list, tuple)) and len(out) == len(val) else [None] * len(val)
        return type(val)(_layouts(v, o) for v, o in zip(val, outs))
    return val


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


def _multi_outputs(g, kernel, spec, path):
    out = []
    for i, v in enumerate(spec):
        if isinstance(v, Layout):
            out.append(TensorBox(g.register_buffer(MultiOutput(None, v, kernel, path + (i,)))))
        elif isinstance(v, (list, tuple)):
            out.append(_multi_outputs(g, kernel, v, path + (i,)))
        elif isinstance(v, torch.SymInt):
            out.append(sympify(v))
        else:
            out.append(v)
    return tuple(out) if isinstance(spec, tuple) else out


def _realize_nested(a):
    if isinstance(a, TensorBox):
        return a.realize()
    if isinstance(a, dict):
        return {k: _realize_nested(v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return type(a)(_realize_nested(b) for b in a)
    return a


def fallback_higher_order(op, args, kwargs, node: torch.fx.Node):
    """A higher-order op (a user's @triton.jit kernel: triton_kernel_wrapper_functional) runs as an
    extern call from the wrapper; its dict of outputs becomes one MultiOutput per tensor."""
    g = state.current_graph()
    ir_args = [_realize_nested(a) for a in args]
    ir_kwargs = {k: _realize_nested(v) for k, v in kwargs.items()}
    metrics.fallbacks[str(getattr(op, "__name__", op))] += 1
    val = _traced_value(node)
    if isinstance(val, torch.Tensor):
        return TensorBox(g.register_buffer(ExternKernel(None, Layout.from_tensor(val), op, ir_args, ir_kwargs)))
    kernel = g.register_buffer(ExternKernel(None, None, op, ir_args, ir_kwargs))
    return _outputs(g, kernel, val, ())


def _outputs(g, kernel, val, path: tuple):
    """The extern `kernel`'s result shaped as its fake value `val`: one MultiOutput per tensor, reached by
    its path of indices or keys (a result may nest: run_and_save_rng_state returns (state, (out, mask)))."""
    if isinstance(val, torch.Tensor):
        return TensorBox(g.register_buffer(MultiOutput(None, Layout.from_tensor(val), kernel, path)))
    if isinstance(val, dict):
        return {k: _outputs(g, kernel, v, path + (k,)) for k, v in val.items()}
    if isinstance(val, (list, tuple)):
        return type(val)(_outputs(g, kernel, v, path + (i,)) for i, v in enumerate(val))
    return val


def _traced_value(node: torch.fx.Node):
    """The node's fake value; where the graph has none (the partitioner's run_and_save_rng_state and
    run_with_rng_state, which replay a checkpointed region's random op in the backward), the op run on its
    arguments' fake values."""
    val = node.meta.get("val")
    if val is not None:
        return val
    fake = lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    args = torch.utils._pytree.tree_map(fake, node.args)
    kwargs = torch.utils._pytree.tree_map(fake, node.kwargs)
    mode = torch._guards.detect_fake_mode(args)
    if mode is None:
        return None
    with mode:
        return node.target(*args, **kwargs)
