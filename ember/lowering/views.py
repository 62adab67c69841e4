"""Views never copy. On a stored buffer a view is a ReinterpretView (a new size/stride/offset onto the
same storage); on an unstored computation it is a Pointwise whose index function remaps the index."""
from __future__ import annotations

import sympy
import torch

from .. import state
from ..ir.nodes import Buffer, ComputedBuffer, InputBuffer, Layout, Pointwise, ReinterpretView, TensorBox
from ..ir.symbolic import (FloorDiv, ModularIndexing, Remembered, contiguous_strides, hint, integer_form, product,
                           settle_min_max, statically_known_equal, sympify, sympy_list)
from .layouts import is_dense
from .registry import Unsupported, lower

aten = torch.ops.aten


def _strided_base(x: TensorBox):
    """(base buffer, layout) when x is stored memory, else None."""
    d = x.data
    if isinstance(d, ReinterpretView):
        return d.data, d.layout
    if isinstance(d, Buffer) and d.layout is not None:
        return d, d.layout
    return None


def make_view(x: TensorBox, size, layout_fn, reindex) -> TensorBox:
    """layout_fn(layout) -> new Layout or None; reindex(new_index) -> index into x."""
    base = _strided_base(x)
    if base is not None:
        buf, layout = base
        new_layout = layout_fn(layout)
        if new_layout is not None:
            return TensorBox(ReinterpretView(buf, new_layout))
    loader = x.make_loader()
    view = TensorBox.pointwise(x.device, x.dtype, lambda idx: loader(reindex(idx)), list(size))
    view.data.view_of = (x, layout_fn)
    return view


def stored_view(box: TensorBox, stride=None):
    """A ReinterpretView for `box` when it is a view (reshape, permute, expand ...) of a value not yet
    stored: the base is stored, dense, and the view becomes a view of its buffer, as it would have been
    had the base been stored first. An extern reading the view and a graph output (or another reader) of
    the base then share one buffer; storing the view itself made a second copy of the same values (BERT's
    attention probabilities: saved for the backward in 4-D, read by a bmm in 3-D). None, storing nothing,
    where the view would have other strides than `stride` (size-1 dims aside), reads fewer elements than
    its base (a slice: storing the base would compute unread ones) or cannot be a view of it."""
    layout = _prospective_layout(box)
    if layout is None or (stride is not None and any(
            n != 1 and a != b for n, a, b in zip(layout.size, layout.stride, stride))):
        return None
    base, layout_fn = box.data.view_of
    if not base.is_realized():
        inner = stored_view(base)
        if inner is not None:
            base.data = inner
        else:
            base.realize()
    buf, base_layout = _strided_base(base)
    return ReinterpretView(buf, layout_fn(base_layout))


def _prospective_layout(box: TensorBox):
    """The layout stored_view would give box, storing nothing; None where it gives none."""
    link = getattr(box.data, "view_of", None)
    if link is None:
        return None
    base, layout_fn = link
    try:
        if int(hint(product(base.get_size()))) > int(hint(product(box.get_size()))):
            return None
    except (TypeError, ValueError):
        return None
    if base.is_realized():
        stored = _strided_base(base)
        base_layout = stored[1] if stored is not None else None
    else:
        base_layout = _prospective_layout(base)
        if base_layout is None and isinstance(base.data, Pointwise):
            base_layout = Layout.contiguous(base.device, base.dtype, base.get_size())
    return layout_fn(base_layout) if base_layout is not None else None


def _dim(d, ndim):
    return d + ndim if d < 0 else d


@lower(aten.permute.default)
def permute(x, dims):
    n = x.dim()
    dims = [_dim(d, n) for d in dims]
    size = [x.get_size()[d] for d in dims]

    def layout_fn(l):
        return Layout(l.device, l.dtype, [l.size[d] for d in dims], [l.stride[d] for d in dims], l.offset)

    def reindex(idx):
        old = [None] * n
        for new_pos, d in enumerate(dims):
            old[d] = idx[new_pos]
        return old

    return make_view(x, size, layout_fn, reindex)


@lower(aten.t.default)
def t(x):
    return permute(x, list(range(x.dim()))[::-1]) if x.dim() == 2 else x


@lower(aten.transpose.int)
def transpose(x, d0, d1):
    n = x.dim()
    if n == 0:
        return x
    dims = list(range(n))
    d0, d1 = _dim(d0, n), _dim(d1, n)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


@lower(aten.expand.default)
def expand(x, size, *, implicit=False):
    size = [sympify(s) for s in size]
    old = x.get_size()
    lead = len(size) - len(old)
    size = [old[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size)]
    if list(size) == list(old):
        return x

    def layout_fn(l):
        stride = [sympy.Integer(0)] * lead + [sympy.Integer(0) if (o == 1 and s != 1) else st
                                              for o, s, st in zip(l.size, size[lead:], l.stride)]
        return Layout(l.device, l.dtype, list(size), stride, l.offset)

    def reindex(idx):
        return [sympy.Integer(0) if (o == 1 and size[i + lead] != 1) else idx[i + lead] for i, o in enumerate(old)]

    return make_view(x, size, layout_fn, reindex)


@lower(aten.unsqueeze.default)
def unsqueeze(x, dim):
    n = x.dim()
    dim = dim + n + 1 if dim < 0 else dim
    size = list(x.get_size())
    size.insert(dim, sympy.Integer(1))

    def layout_fn(l):
        stride = list(l.stride)
        stride.insert(dim, stride[dim] * l.size[dim] if dim < n else sympy.Integer(1))
        return Layout(l.device, l.dtype, size, stride, l.offset)

    return make_view(x, size, layout_fn, lambda idx: idx[:dim] + idx[dim + 1:])


@lower(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(x, dims=None):
    n = x.dim()
    if dims is None:
        dims = [i for i, s in enumerate(x.get_size()) if s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = {_dim(d, n) for d in dims if n > 0 and x.get_size()[_dim(d, n)] == 1}
    keep = [i for i in range(n) if i not in dims]
    size = [x.get_size()[i] for i in keep]

    def layout_fn(l):
        return Layout(l.device, l.dtype, size, [l.stride[i] for i in keep], l.offset)

    def reindex(idx):
        it = iter(idx)
        return [sympy.Integer(0) if i in dims else next(it) for i in range(n)]

    return make_view(x, size, layout_fn, reindex)


@lower(aten.slice.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    n = x.dim()
    dim = _dim(dim, n)
    dimsize = x.get_size()[dim]
    start = _clamp_index(0 if start is None else sympify(start), dimsize)
    end = _clamp_index(dimsize if end is None else sympify(end), dimsize)
    length = sympy.Max(sympy.Integer(0), FloorDiv(end - start + step - 1, sympify(step)))
    if start == 0 and end == dimsize and step == 1:
        return x
    size = list(x.get_size())
    size[dim] = length

    def layout_fn(l):
        stride = list(l.stride)
        stride[dim] = l.stride[dim] * step
        return Layout(l.device, l.dtype, size, stride, l.offset + l.stride[dim] * start)

    def reindex(idx):
        idx = list(idx)
        idx[dim] = start + idx[dim] * step
        return idx

    return make_view(x, size, layout_fn, reindex)


@lower(aten.split_with_sizes.default, aten.split.Tensor)
def split(x, sizes, dim=0):
    """Slices of x along dim (split.Tensor's int is a chunk length; the last chunk may be shorter)."""
    dim = _dim(dim, x.dim())
    dimsize = x.get_size()[dim]
    if not isinstance(sizes, (list, tuple)):
        step = sympify(sizes)
        if not (step.is_Integer and dimsize.is_Integer):
            raise Unsupported("split into chunks of a symbolic size")
        n, step = int(dimsize), int(step)
        sizes = [min(step, n - i) for i in range(0, n, step)] if step > 0 else [n]
    out, start = [], sympy.Integer(0)
    for length in sizes:
        end = start + sympify(length)
        out.append(_slice_exact(x, dim, start, end))
        start = end
    return out


def _slice_exact(x, dim, start, end):
    """x[start:end] along dim, for bounds known to lie within the dimension."""
    if start == 0 and end == x.get_size()[dim]:
        return x
    size = list(x.get_size())
    size[dim] = end - start

    def layout_fn(l):
        return Layout(l.device, l.dtype, size, list(l.stride), l.offset + l.stride[dim] * start)

    def reindex(idx):
        idx = list(idx)
        idx[dim] = idx[dim] + start
        return idx

    return make_view(x, size, layout_fn, reindex)


def _clamp_index(i, size):
    """A slice bound as torch reads it: a negative one counts from the end, then it is clamped to [0, size]."""
    i, size = sympify(i), sympify(size)
    if i.is_Integer and size.is_Integer:
        v, n = int(i), int(size)
        if v < 0:
            v += n
        return sympy.Integer(min(max(v, 0), n))
    if i.is_Integer and int(i) >= 2 ** 62:
        return size
    if i.is_nonnegative:
        return settle_min_max(sympy.Min(i, size))
    if i.is_negative:               # x[-n:] with n a symbol: Dynamo passes -s0
        return settle_min_max(sympy.Max(sympy.Integer(0), size + i))
    raise Unsupported(f"a slice bound of unknown sign ({i})")


@lower(aten.select.int)
def select(x, dim, index):
    n = x.dim()
    dim = _dim(dim, n)
    index = sympify(index)
    if index.is_negative:           # counts from the end (an int, or a symbolic index Dynamo knows is negative)
        index = x.get_size()[dim] + index
    elif not index.is_nonnegative:
        raise Unsupported(f"a select index of unknown sign ({index})")
    size = [s for i, s in enumerate(x.get_size()) if i != dim]

    def layout_fn(l):
        return Layout(l.device, l.dtype, size, [s for i, s in enumerate(l.stride) if i != dim],
                      l.offset + l.stride[dim] * index)

    return make_view(x, size, layout_fn, lambda idx: list(idx[:dim]) + [index] + list(idx[dim:]))


def _infer_size(size, numel):
    size = [sympify(s) for s in size]
    if any(s == -1 for s in size):
        known = product(s for s in size if s != -1)
        # exact, though sympy may not see it: numel / known of symbolic sizes is written as FloorDiv
        size = [integer_form(sympy.simplify(numel / known)) if s == -1 else s for s in size]
    return size


@lower(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def view(x, size):
    if isinstance(size, torch.dtype):
        raise Unsupported("view as dtype")
    old = list(x.get_size())
    size = _infer_size(size, product(old))
    if size == old:
        return x

    def layout_fn(l):
        if l.is_contiguous():
            return Layout(l.device, l.dtype, size, contiguous_strides(size), l.offset)
        strides = _view_strides(l.size, l.stride, size)
        return None if strides is None else Layout(l.device, l.dtype, size, strides, l.offset)

    old_strides = contiguous_strides(old)
    new_strides = contiguous_strides(size)

    def unflatten(idx: tuple) -> tuple:
        flat = sum((i * s for i, s in zip(idx, new_strides)), sympy.Integer(0))
        out = []
        for j, (n, st) in enumerate(zip(old, old_strides)):
            if n == 1:
                out.append(sympy.Integer(0))
            elif j == 0:
                out.append(FloorDiv(flat, st))
            else:
                out.append(ModularIndexing(flat, st, n))
        return tuple(out)

    remembered = Remembered(unflatten)     # each run of a reader's inner_fn asks again
    return make_view(x, size, layout_fn, lambda idx: list(remembered(tuple(idx))))


def _view_strides(old_size, old_stride, new_size):
    """Strides that view a strided layout as new_size without a copy, as eager's view does (ATen's
    computeStride), or None where it must copy. With symbolic sizes, the example sizes steer the walk
    and every equality it relies on must hold for all sizes (else None: a copy, valid for any size)."""
    old_size, old_stride, new_size = sympy_list(old_size), sympy_list(old_stride), sympy_list(new_size)
    if not old_size:
        return [sympy.Integer(1)] * len(new_size)
    if any(n == 0 for n in old_size):
        return None
    new_stride = [sympy.Integer(0)] * len(new_size)
    view_d = len(new_size) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel, view_numel = sympy.Integer(1), sympy.Integer(1)
    for tensor_d in range(len(old_size) - 1, -1, -1):
        tensor_numel = tensor_numel * old_size[tensor_d]
        if tensor_d == 0 or (old_size[tensor_d - 1] != 1 and
                             not statically_known_equal(old_stride[tensor_d - 1], tensor_numel * chunk_base_stride)):
            while view_d >= 0 and (hint(view_numel) < hint(tensor_numel) or new_size[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * new_size[view_d]
                view_d -= 1
            if not statically_known_equal(view_numel, tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel, view_numel = sympy.Integer(1), sympy.Integer(1)
    if view_d != -1:
        return None
    return new_stride


@lower(aten.flip.default)
def flip(x, dims):
    # a copy in eager, an index remap here (no strides express it): consumers read x backwards, as the
    # backward of a scan (flip, scan, flip) does
    n = x.dim()
    dims = {_dim(d, n) for d in dims} if n else set()
    size, loader = x.get_size(), x.make_loader()
    return TensorBox.pointwise(x.device, x.dtype, lambda idx: loader(
        [size[i] - 1 - v if i in dims else v for i, v in enumerate(idx)]), list(size))


@lower(aten.view.dtype)
def view_dtype(x, dtype):
    raise Unsupported("view as another dtype")


@lower(aten.alias.default, aten.detach.default)
def alias(x):
    return x


@lower(aten.as_strided.default)
def as_strided(x, size, stride, storage_offset=None):
    """A view of x's *storage*. A graph input's storage is eager's; a computed value's storage in eager
    is laid out as eager lays out that value (its fake tensor's strides), which need not be how ember
    stored it. So: views of inputs read the input; a view of a computed value is taken of a buffer stored
    with eager's layout, when eager's storage is exactly the value's own elements; anything else is an
    error (the graph then runs eagerly) rather than a wrong answer."""
    size, stride = [sympify(s) for s in size], [sympify(s) for s in stride]
    base = _strided_base(x)
    if base is not None and isinstance(base[0], InputBuffer):
        buf, layout = base
        offset = layout.offset if storage_offset is None else sympify(storage_offset)
        return TensorBox(ReinterpretView(buf, Layout(layout.device, layout.dtype, size, stride, offset)))
    meta = input_meta(0)
    offset = sympify(storage_offset if storage_offset is not None else 0)
    if not _owns_its_storage(meta) or not _within(size, stride, offset, meta.numel()):
        raise NotImplementedError("as_strided of a computed value whose eager storage is not its own elements")
    want = [sympify(s) for s in meta.stride()]
    d = x.data
    if not (isinstance(d, Buffer) and d.layout is not None and list(d.layout.stride) == want
            and d.layout.offset == 0 and isinstance(d, ComputedBuffer)):
        loader = x.make_loader()
        layout = Layout(x.device, x.dtype, list(x.get_size()), want)
        d = state.current_graph().register_buffer(
            ComputedBuffer(None, layout, Pointwise(x.device, x.dtype, loader, list(x.get_size()))))
    return TensorBox(ReinterpretView(d, Layout(d.layout.device, d.layout.dtype, size, stride, offset)))


def input_meta(i):
    """The fake tensor (eager's value: its sizes and strides) of the lowered node's i-th argument, or None."""
    node = state.current_graph().current_node
    arg = node.args[i] if node is not None and len(node.args) > i else None
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _owns_its_storage(meta) -> bool:
    if not isinstance(meta, torch.Tensor) or not is_dense(meta):
        return False
    try:
        nbytes, numel = sympify(meta.untyped_storage().nbytes()), sympify(meta.numel())
    except Exception:
        return False
    return sympy.expand(nbytes - numel * meta.element_size()) == 0


def _within(size, stride, offset, numel) -> bool:
    """Whether every element the view addresses lies in [0, numel), for every size the graph runs with
    (sizes are symbols of positive integers: a difference sympy cannot prove non-negative is a no)."""
    size, stride, offset, numel = [sympify(n) for n in size], [sympify(s) for s in stride], sympify(offset), \
        sympify(numel)
    if any(n == 0 for n in size):
        return True
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    return all(sympy.expand(e).is_nonnegative is True for e in [offset, *stride, numel - 1 - last])


@lower(aten.expand_copy.default, aten.permute_copy.default, aten.view_copy.default)
def _copy_views(x, *args, **kwargs):
    raise Unsupported("copy variants of views")
