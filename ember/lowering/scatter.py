"""Scatters: index_put, scatter, scatter_add, scatter_reduce. index_add, index_copy, index_fill and
embedding's backward reach ember as index_put (graph/decompose.py).

A scatter's result is a new buffer written by two kernels in order: the fill (a copy of `self`, or
whatever computation `self` is, inlined) and the scatter, a ScatterBuffer that iterates over the source
and stores each element at a position loaded at run time (`ops.indirect_indexing`: negative indices
wrap, out-of-range ones fail the call where the backend checks). Repeated positions keep any one value
(as eager does), or accumulate with `mode="atomic_add"`. The scheduler keeps fill, scatter and readers
in separate kernels, in that order: an indirect store counts as a read of its buffer (ir/deps.py), and
fusion.py never puts a scatter with another reader or writer of its buffer.

Atomic adds exist for 32- and 64-bit types only: float16/bfloat16 accumulate in a float32 buffer (closer
to the exact sum than eager's rounding at every step), narrow integers and bool in int64, and the result
is cast back, which wraps (or tests != 0) as eager's own arithmetic does.
"""
from __future__ import annotations

import sympy
import torch

from .. import metrics, state
from ..ir.nodes import ComputedBuffer, InputBuffer, Layout, Pointwise, ScatterBuffer, TensorBox
from ..ir.ops import ops
from ..ir.symbolic import product, statically_known_equal, sympify
from .indexing import advanced_index_region
from .layouts import is_dense, is_non_overlapping
from .pointwise import broadcast_loader, cast, scalar_value, to_dtype
from .registry import Unsupported, lower

aten = torch.ops.aten


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype in (torch.int8, torch.int16, torch.uint8, torch.bool):
        return torch.int64
    raise Unsupported(f"accumulating scatter into {dtype}")


def _layout(size, dtype, device) -> Layout:
    """Eager's strides for the node's result where they are dense (index_put keeps `self`'s layout);
    a backward graph reading a saved output was compiled for them."""
    meta = state.current_graph().current_node.meta.get("val")
    if isinstance(meta, torch.Tensor) and meta.dtype == dtype and is_dense(meta) and \
            [sympify(s) for s in meta.shape] == list(size):
        return Layout(device, dtype, list(size), [sympify(s) for s in meta.stride()])
    return Layout.contiguous(device, dtype, size)


def new_target(x: TensorBox, dtype: torch.dtype) -> ComputedBuffer:
    """A fresh buffer holding x as dtype, for scatters to write into (never x's own storage: other
    readers of x must still see it unchanged)."""
    load, src = x.make_loader(), x.dtype
    data = Pointwise(x.device, dtype, lambda idx: cast(load(idx), src, dtype), list(x.get_size()))
    return state.current_graph().register_buffer(ComputedBuffer(None, _layout(x.get_size(), dtype, x.device), data))


def scatter_target(x: TensorBox, dtype: torch.dtype):
    """Where a scatter of x writes: x's own input buffer when the graph only writes the scatter's result
    back into that input (a KV cache's `index_copy_`), else a fresh copy of x (`new_target`).

    Functionalization turns `cache.index_copy_(...)` into a scatter into a copy of the input and a `copy_`
    of the result back into the input at the end; when nothing else reads the input, the scatter can write
    into the input itself, and neither the copy nor the write-back is needed (copy_ sees the same buffer
    and records nothing). Readers of the result read the input after the scatter: the scheduler orders them
    by the input's name, as it orders readers of any scattered buffer."""
    if dtype == x.dtype and isinstance(x.data, InputBuffer) and type(x.data) is InputBuffer and \
            _only_written_back(state.current_graph().current_node):
        metrics.scatters_in_place += 1
        return x.data
    return new_target(x, dtype)


def _only_written_back(node) -> bool:
    """Whether `node` (a functional scatter of a graph input) is the input's one reader, and the input's
    one other user is the `copy_` that writes `node`'s result back into it."""
    if node is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    src = node.args[0]
    meta = src.meta.get("val")
    if src.op != "placeholder" or not isinstance(meta, torch.Tensor) or \
            not (is_dense(meta) or is_non_overlapping(meta)):
        return False
    others = [u for u in src.users if u is not node]
    return len(others) == 1 and others[0].target is aten.copy_.default and \
        others[0].args[0] is src and others[0].args[1] is node


def scatter_store(target: ComputedBuffer, ranges, indexer, value, mode=None) -> None:
    """For each index over `ranges`, store value(index) (any dtype: cast to the target's) at
    indexer(index) of target."""
    if any(statically_known_equal(n, 0) for n in ranges):
        return
    dtype = target.get_dtype()

    def inner_fn(idx):
        v, vdt = value(idx)
        return cast(v, vdt, dtype)
    data = Pointwise(target.get_device(), dtype, inner_fn, list(ranges))
    state.current_graph().register_buffer(ScatterBuffer(None, target, data, indexer, mode))


def _index_ok(index: TensorBox):
    if index.dtype not in (torch.int64, torch.int32):
        raise Unsupported(f"scatter index of dtype {index.dtype}")


def _tensor_value(src: TensorBox, size):
    load, dtype = broadcast_loader(src, size), src.dtype
    return lambda idx: (load(idx), dtype)


def _src_value(src: TensorBox):
    """src read at the scatter index's own position (src may be larger than the index)."""
    load, dtype = src.make_loader(), src.dtype
    return lambda idx: (load(idx), dtype)


def _scalar_value(v, dtype):
    return lambda idx: (scalar_value(v, dtype), dtype)


def _scatter(x: TensorBox, dim: int, index: TensorBox, value, mode=None, accumulate_dtype=None) -> TensorBox:
    """x with value(i) stored at x[..., index[i], ...] (index's position replaced along dim) for every
    element i of index. `value` maps an index over index's shape to (ops value, dtype)."""
    if x.dim() == 0:
        raise Unsupported("scatter into a 0-dim tensor")
    _index_ok(index)
    dim = dim % x.dim()
    dtype = accumulate_dtype or x.dtype
    target = scatter_target(x, dtype)
    scatter_store(target, index.get_size(), _dim_indexer(index, dim, x.get_size()[dim]), value, mode)
    return _cast_back(target, x.dtype)


def _dim_indexer(index: TensorBox, dim: int, size):
    il = index.make_loader()

    def indexer(idx):
        i = ops.indirect_indexing(il(idx), size)
        return [i if d == dim else v for d, v in enumerate(idx)]
    return indexer


def _cast_back(target, dtype) -> TensorBox:
    out = TensorBox(target)
    return out if target.get_dtype() == dtype else to_dtype(out, dtype)


# --- scatter, scatter_add, scatter_reduce -----------------------------------------------------------------

@lower(aten.scatter.src)
def scatter_src(x, dim, index, src):
    return _scatter(x, dim, index, _src_value(src))


@lower(aten.scatter.value)
def scatter_value(x, dim, index, value):
    return _scatter(x, dim, index, _scalar_value(value, x.dtype))


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    if reduce != "add":
        raise Unsupported(f"scatter with reduce={reduce!r}")
    value = _src_value(src) if isinstance(src, TensorBox) else _scalar_value(src, x.dtype)
    return _scatter(x, dim, index, value, "atomic_add", _accumulate_dtype(x.dtype))


@lower(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, _src_value(src), "atomic_add", _accumulate_dtype(x.dtype))


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if reduce not in ("sum", "mean"):
        # amax / amin / prod would need compare-and-swap loops in both kernel backends
        raise Unsupported(f"scatter_reduce with reduce={reduce!r}")
    if x.dim() == 0:
        raise Unsupported("scatter into a 0-dim tensor")
    _index_ok(index)
    dim = dim % x.dim()
    acc = _accumulate_dtype(x.dtype)
    indexer = _dim_indexer(index, dim, x.get_size()[dim])
    sums = new_target(x, acc)
    if not include_self:
        # the scattered positions start from 0, every other one keeps self
        scatter_store(sums, index.get_size(), indexer, _scalar_value(0, acc))
    scatter_store(sums, index.get_size(), indexer, _src_value(src), "atomic_add")
    if reduce == "sum":
        return _cast_back(sums, x.dtype)
    start = TensorBox.pointwise(x.device, acc, lambda idx: scalar_value(int(include_self), acc), x.get_size())
    counts = new_target(start, acc)
    scatter_store(counts, index.get_size(), indexer, _scalar_value(1, acc), "atomic_add")
    sl, cl = TensorBox(sums).make_loader(), TensorBox(counts).make_loader()

    def mean(idx):
        c = cl(idx)
        c = ops.where(ops.eq(c, ops.constant(0, acc)), ops.constant(1, acc), c)
        q = ops.truediv(sl(idx), c) if acc.is_floating_point else ops.floordiv(sl(idx), c)
        return cast(q, acc, x.dtype)
    return TensorBox.pointwise(x.device, x.dtype, mean, x.get_size())


# --- index_put ------------------------------------------------------------------------------------------

def _values(values: TensorBox, shape):
    if values.dim() > len(shape):
        raise Unsupported("index_put values with more dims than the indexed region")
    return _tensor_value(values, shape)


def _masked_put(x, mask, values, accumulate):
    """x[mask] = v (or += v) with one value: elementwise, no data-dependent sizes."""
    if not statically_known_equal(product(values.get_size()), 1):
        raise Unsupported("boolean-mask index_put with several values (their positions depend on the data)")
    if mask.dim() == 0 or (accumulate and x.dtype == torch.bool):
        raise Unsupported("0-dim boolean mask, or accumulating into bool")
    ml, vl = broadcast_loader(mask, x.get_size()[:mask.dim()]), values.make_loader()
    xl, vzero = x.make_loader(), [sympy.Integer(0)] * values.dim()
    k = mask.dim()

    def inner_fn(idx):
        v = cast(vl(vzero), values.dtype, x.dtype)
        m = cast(ml(idx[:k]), mask.dtype, torch.bool)
        old = xl(idx)
        return ops.where(m, ops.add(old, v) if accumulate else v, old)
    return TensorBox.pointwise(x.device, x.dtype, inner_fn, x.get_size())


@lower(aten.index_put.default, aten.index_put.hacked_twin, aten._unsafe_index_put.hacked_twin)
def index_put(x, indices, values, accumulate=False):
    if values.device != x.device or any(t is not None and t.device != x.device for t in indices):
        raise Unsupported("index_put across devices")
    tensors = [t for t in indices if t is not None]
    if not tensors:
        raise Unsupported("index_put without index tensors")
    if any(t.dtype in (torch.bool, torch.uint8) for t in tensors):
        if len(indices) != 1:
            raise Unsupported("boolean mask index_put with other indices")
        return _masked_put(x, indices[0], values, accumulate)
    shape, indexer = advanced_index_region(x, indices)
    if not accumulate:
        target = scatter_target(x, x.dtype)
        scatter_store(target, shape, indexer, _values(values, shape))
        return TensorBox(target)
    target = scatter_target(x, _accumulate_dtype(x.dtype))
    scatter_store(target, shape, indexer, _values(values, shape), "atomic_add")
    return _cast_back(target, x.dtype)


@lower(aten._index_put_impl.default)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)
