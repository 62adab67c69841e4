"""cat, stack, constant_pad_nd, slice_scatter, select_scatter and as_strided_scatter as Pointwise computations,
so producers and consumers fuse with them (slice and select scatters are what the backward of slicing and
indexing a tensor produces: a rotary embedding's halves, in every attention layer's backward; an
as_strided_scatter, the backward of a restrided view).

Each output element loads from the input that covers it. A load must stay in bounds even where its value
is not selected, so the index into each input is clamped and goes through `ops.indirect_indexing`; the
value is picked with `ops.where`. Every input is read once per output element, so only a few inputs are
concatenated this way; more go to ATen's cat.
"""
from __future__ import annotations

import sympy
import torch

from ..ir.nodes import TensorBox
from ..ir.ops import ops
from ..ir.symbolic import guard_le, sympify
from .pointwise import cast, promote, scalar_value
from .registry import Unsupported, lower
from .layouts import is_dense
from .views import input_meta, unsqueeze

aten = torch.ops.aten

MAX_POINTWISE_CAT_INPUTS = 8


def _clamped_index(i, lo, size, step: int = 1):
    """Index (i - lo) // step clamped into [0, size): an in-bounds position even where i is outside that
    input."""
    v = ops.index_expr(i - lo, torch.int64)
    v = ops.maximum(v, ops.constant(0, torch.int64))
    if step != 1:
        v = ops.floordiv(v, ops.constant(step, torch.int64))
    v = ops.minimum(v, ops.index_expr(size - 1, torch.int64) if not sympify(size - 1).is_Integer
                    else ops.constant(int(size - 1), torch.int64))
    return ops.indirect_indexing(v, size)


def _in_range(i, lo, hi):
    v = ops.index_expr(i, torch.int64)
    return ops.logical_and(ops.ge(v, ops.index_expr(sympify(lo), torch.int64)),
                           ops.lt(v, ops.index_expr(sympify(hi), torch.int64)))


@lower(aten.cat.default)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.get_size()[0] == 0)]  # legacy empty inputs
    if not tensors:
        raise Unsupported("cat of nothing")
    _, dtype = promote(tensors)          # every input takes part in type promotion, empty ones too
    n = tensors[0].dim()
    dim = dim + n if dim < 0 else dim
    # an input with no elements along dim adds nothing, and loading from it (even clamped) is out of range
    nonempty = [t for t in tensors if sympify(t.get_size()[dim]) != 0]
    tensors = nonempty or tensors[:1]
    if len(tensors) == 1:
        t = tensors[0]
        loader = t.make_loader()
        return TensorBox.pointwise(t.device, dtype, lambda idx: cast(loader(idx), t.dtype, dtype), t.get_size())
    if len({t.device for t in tensors}) > 1:
        raise Unsupported("cat of tensors on several devices")
    if len(tensors) > MAX_POINTWISE_CAT_INPUTS:
        # every element of a pointwise cat tests each input's range: past a few inputs, cat groups of
        # them into buffers first (torch 2.11 traces cumprod's backward with a cat per element)
        groups = [tensors[i:i + MAX_POINTWISE_CAT_INPUTS] for i in range(0, len(tensors), MAX_POINTWISE_CAT_INPUTS)]
        tensors = []
        for g in groups:
            part = cat(g, dim) if len(g) > 1 else g[0]
            part.realize()
            tensors.append(part)
        return cat(tensors, dim)
    offsets, total = [], sympy.Integer(0)
    for t in tensors:
        offsets.append(total)
        total = total + t.get_size()[dim]
    size = list(tensors[0].get_size())
    size[dim] = total
    parts = [(t.make_loader(), t.dtype, t.get_size()[dim], off) for t, off in zip(tensors, offsets)]

    def inner_fn(idx):
        i = idx[dim]
        value = None
        for loader, src, length, off in reversed(parts):
            here = list(idx)
            here[dim] = _clamped_index(i, off, length)
            v = cast(loader(here), src, dtype)
            value = v if value is None else ops.where(_in_range(i, off, off + length), v, value)
        return value
    return TensorBox.pointwise(tensors[0].device, dtype, inner_fn, size)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    n = tensors[0].dim() + 1
    dim = dim + n if dim < 0 else dim
    return cat([unsqueeze(t, dim) for t in tensors], dim)


def _known_nonpositive(e) -> bool:
    """True only when e <= 0 for every value of its symbols (a symbolic pad is checked at run time)."""
    return bool(sympify(e).is_nonpositive)


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    n = x.dim()
    lo, hi = [sympy.Integer(0)] * n, [sympy.Integer(0)] * n
    for k in range(len(pad) // 2):
        d = n - 1 - k
        lo[d], hi[d] = sympify(pad[2 * k]), sympify(pad[2 * k + 1])
    in_size = x.get_size()
    size = [s + a + b for s, a, b in zip(in_size, lo, hi)]
    loader, dtype = x.make_loader(), x.dtype
    if any(sympify(s) == 0 for s in in_size):
        # nothing to load from: the output is all padding
        return TensorBox.pointwise(x.device, dtype, lambda idx: scalar_value(value, dtype), size)

    def inner_fn(idx):
        here, inside = [], None
        for d in range(n):
            if lo[d] == 0 and _known_nonpositive(hi[d]):
                here.append(idx[d])             # no padding before; cropping after needs no check
                continue
            if lo[d].is_Integer and int(lo[d]) < 0 and _known_nonpositive(hi[d]):
                here.append(idx[d] - lo[d])     # cropped on both sides: a plain shift
                continue
            here.append(_clamped_index(idx[d], lo[d], in_size[d]))
            cond = _in_range(idx[d], lo[d], lo[d] + in_size[d])
            inside = cond if inside is None else ops.logical_and(inside, cond)
        v = loader(here)
        if inside is None:
            return v
        return ops.where(inside, v, scalar_value(value, dtype))
    return TensorBox.pointwise(x.device, dtype, inner_fn, size)


def _le(a, b) -> bool:
    """a <= b for every size the graph runs with (by a guard where the example sizes decide it); Unsupported
    where neither that nor its opposite can be promised."""
    d = sympify(a - b)
    if d.is_Integer:
        return int(d) <= 0
    if guard_le(d, 0):
        return True
    if guard_le(-d, -1):
        return False
    raise Unsupported("slice_scatter bounds against a symbolic size")


def _slice_bounds(length, start, end, step) -> tuple:
    """(start, end) of a slice along a dim of `length`, as ATen normalizes them: negative from the end,
    clamped into [0, length], end at least start. A bound may be symbolic (an int Dynamo made dynamic)."""
    if not isinstance(step, int) or step < 1:
        raise Unsupported("slice_scatter with a symbolic or non-positive step")

    def clamped(v):
        if v is None or (isinstance(v, int) and v >= 2 ** 62):     # past any size: `end` of INT64_MAX
            return sympify(length)
        v = sympify(v)
        if not _le(0, v):
            v = v + length
        if _le(v, 0):
            return sympify(0)
        return sympify(length) if _le(length, v) else v
    start, end = clamped(0 if start is None else start), clamped(end)
    if start == 0:      # end is in [0, length] already: no comparison (none may be decidable for a size
        return start, end   # like FloorDiv(s - 1, 16) + 1, a strided convolution's output)
    return start, (start if _le(end, start) else end)


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """x with src written over x[start:end:step] along dim."""
    dim = dim + x.dim() if dim < 0 else dim
    start, end = _slice_bounds(x.get_size()[dim], start, end, step)
    count = src.get_size()[dim]
    if sympify(count) == 0:
        return TensorBox.pointwise(x.device, x.dtype, x.make_loader(), x.get_size())
    if src.device != x.device:
        raise Unsupported("slice_scatter across devices")
    load_x, load_src, dtype = x.make_loader(), src.make_loader(), x.dtype

    def inner_fn(idx):
        i = idx[dim]
        here = list(idx)
        here[dim] = _clamped_index(i, start, count, step)
        inside = _in_range(i, start, end)
        if step != 1:
            on_step = ops.eq(ops.remainder(ops.index_expr(i - start, torch.int64), ops.constant(step, torch.int64)),
                             ops.constant(0, torch.int64))
            inside = ops.logical_and(inside, on_step)
        return ops.where(inside, cast(load_src(here), src.dtype, dtype), load_x(idx))
    return TensorBox.pointwise(x.device, dtype, inner_fn, x.get_size())


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    """x with src (x's shape without dim) written over x.select(dim, index)."""
    dim = dim + x.dim() if dim < 0 else dim
    if not isinstance(index, int):
        raise Unsupported("select_scatter at a symbolic index")
    length = x.get_size()[dim]
    position = sympify(index + length if index < 0 else index)
    if src.device != x.device:
        raise Unsupported("select_scatter across devices")
    load_x, load_src, dtype = x.make_loader(), src.make_loader(), x.dtype

    def inner_fn(idx):
        chosen = ops.eq(ops.index_expr(idx[dim], torch.int64), ops.index_expr(position, torch.int64))
        value = cast(load_src([*idx[:dim], *idx[dim + 1:]]), src.dtype, dtype)
        return ops.where(chosen, value, load_x(idx))
    return TensorBox.pointwise(x.device, dtype, inner_fn, x.get_size())


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """x with src written over `x.as_strided(size, stride, storage_offset)`, as ATen computes it: the view
    addresses the storage of a clone of x (x's strides, offset 0). Lowered where x is laid out densely and
    the view is a dense block of that storage (its strides, smallest first, each the product of the sizes
    below it), so that each storage position of the block is one element of src; AOTAutograd emits such
    scatters for the gradient of a view of a graph output."""
    meta = input_meta(0)
    if not isinstance(meta, torch.Tensor) or not is_dense(meta):
        raise Unsupported("as_strided_scatter into a tensor that is not laid out densely")
    if src.device != x.device:
        raise Unsupported("as_strided_scatter across devices")
    size, stride = [sympify(s) for s in size], [sympify(s) for s in stride]
    offset = sympify(0 if storage_offset is None else storage_offset)
    load_x, load_src, dtype = x.make_loader(), src.make_loader(), x.dtype
    if any(n == 0 for n in size):
        return TensorBox.pointwise(x.device, dtype, load_x, x.get_size())
    moving = [d for d in range(len(size)) if size[d] != 1]
    if not all(stride[d].is_Integer for d in moving):
        raise Unsupported("as_strided_scatter through symbolic strides")
    block = sympify(1)
    for d in sorted(moving, key=lambda d: int(stride[d])):
        if sympy.expand(stride[d] - block) != 0:
            raise Unsupported("as_strided_scatter through a view that is not a dense block of storage")
        block = block * size[d]
    x_strides = [sympify(s) for s in meta.stride()]

    def inner_fn(idx):
        position = sum((i * s for i, s in zip(idx, x_strides)), sympify(0))
        inside = _in_range(position, offset, offset + block)
        # the position within the block, clamped so that src is read in bounds where it is not written
        at = ops.minimum(ops.maximum(ops.index_expr(position - offset, torch.int64), ops.constant(0, torch.int64)),
                         ops.index_expr(block - 1, torch.int64))
        here = [sympify(0) if size[d] == 1 else
                ops.indirect_indexing(ops.remainder(ops.floordiv(at, ops.constant(int(stride[d]), torch.int64)),
                                                    ops.index_expr(size[d], torch.int64)), size[d])
                for d in range(len(size))]
        return ops.where(inside, cast(load_src(here), src.dtype, dtype), load_x(idx))
    return TensorBox.pointwise(x.device, dtype, inner_fn, x.get_size())
