"""Indexing by tensors: gather, index_select, embedding, advanced indexing (aten.index). Each is a
Pointwise whose load index holds a value loaded from the index tensor (`ops.indirect_indexing`)."""
from __future__ import annotations

import torch

from ..ir.nodes import TensorBox
from ..ir.ops import ops
from .pointwise import broadcast_loader, broadcast_shapes
from .registry import Unsupported, lower

aten = torch.ops.aten


def _dim(d, n):
    return d + n if d < 0 else d


def _index_dtype_ok(index: TensorBox):
    if index.dtype not in (torch.int64, torch.int32):
        raise Unsupported(f"index of dtype {index.dtype}")


@lower(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    _index_dtype_ok(index)
    dim = _dim(dim, x.dim())
    xl, il = x.make_loader(), index.make_loader()
    size = x.get_size()[dim] if x.dim() else 1

    def inner_fn(idx):
        if not x.dim():
            return xl([])
        i = ops.indirect_indexing(il(idx), size)
        return xl([i if d == dim else v for d, v in enumerate(idx)])
    return TensorBox.pointwise(x.device, x.dtype, inner_fn, index.get_size())


@lower(aten.index_select.default)
def index_select(x, dim, index):
    _index_dtype_ok(index)
    if not x.dim():
        raise Unsupported("index_select of a 0-dim tensor")
    dim = _dim(dim, x.dim())
    xl, il = x.make_loader(), index.make_loader()
    out = list(x.get_size())
    if index.dim() > 1:
        raise Unsupported("index_select with a multi-dim index")
    out[dim] = index.get_size()[0] if index.dim() else 1

    def inner_fn(idx):
        i = ops.indirect_indexing(il([idx[dim]] if index.dim() else []), x.get_size()[dim])
        return xl([i if d == dim else v for d, v in enumerate(idx)])
    return TensorBox.pointwise(x.device, x.dtype, inner_fn, out)


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _index_dtype_ok(indices)
    if weight.dim() != 2:
        raise Unsupported("embedding weight that is not 2-D")
    wl, il = weight.make_loader(), indices.make_loader()
    nrows, width = weight.get_size()
    k = indices.dim()

    def inner_fn(idx):
        row = ops.indirect_indexing(il(idx[:k]), nrows)
        return wl([row, idx[k]])
    return TensorBox.pointwise(weight.device, weight.dtype, inner_fn, list(indices.get_size()) + [width])


def advanced_index_region(x: TensorBox, indices: list):
    """(shape, indexer) of x[i0, i1, ...] with integer index tensors (None for a whole dimension):
    the shape of the result, and a function from an index over it to a position of x. Laid out as
    eager's advanced indexing: the broadcast index dims in place when they are adjacent, else first."""
    indices = list(indices) + [None] * (x.dim() - len(indices))
    used = [d for d, t in enumerate(indices) if t is not None]
    for d in used:
        if indices[d].dtype in (torch.bool, torch.uint8):
            raise Unsupported("boolean mask indexing (the result size depends on the data)")
        _index_dtype_ok(indices[d])
    bshape = broadcast_shapes(*[indices[d].get_size() for d in used])
    sizes = x.get_size()
    rest = [d for d in range(x.dim()) if d not in used]
    if used == list(range(used[0], used[-1] + 1)):
        before, after = [d for d in rest if d < used[0]], [d for d in rest if d > used[-1]]
    else:  # PyTorch puts the indexed dims first when the indices are not next to each other
        before, after = [], rest
    shape = [sizes[d] for d in before] + list(bshape) + [sizes[d] for d in after]
    loaders = {d: broadcast_loader(indices[d], bshape) for d in used}
    nb, nk = len(before), len(bshape)

    def indexer(idx):
        full = [None] * x.dim()
        for pos, d in enumerate(before):
            full[d] = idx[pos]
        for pos, d in enumerate(after):
            full[d] = idx[nb + nk + pos]
        for d in used:
            full[d] = ops.indirect_indexing(loaders[d](idx[nb:nb + nk]), sizes[d])
        return full
    return shape, indexer


@lower(aten.index.Tensor)
def index(x, indices):
    """x[i0, i1, ...] with index tensors (None for a whole dimension)."""
    shape, indexer = advanced_index_region(x, indices)
    xl = x.make_loader()
    return TensorBox.pointwise(x.device, x.dtype, lambda idx: xl(indexer(idx)), shape)
