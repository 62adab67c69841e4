"""Tensors made from nothing: full, zeros/ones (decomposed to full), empty, new_empty_strided, scalar_tensor,
arange, iota."""
from __future__ import annotations

import sympy
import torch

from ..ir.nodes import TensorBox
from ..ir.symbolic import FloorDiv, sympify
from .pointwise import canonical_device, index_value, scalar_value
from .registry import Unsupported, lower

aten = torch.ops.aten
prims = torch.ops.prims


def constant_box(value, size, dtype, device) -> TensorBox:
    size = [sympify(s) for s in size]
    return TensorBox.pointwise(canonical_device(device), dtype, lambda idx: scalar_value(value, dtype), size)


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.get_default_dtype() if isinstance(fill_value, float) else \
            (torch.bool if isinstance(fill_value, bool) else torch.int64)
    return constant_box(fill_value, size, dtype, device)


@lower(aten.scalar_tensor.default)
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return constant_box(value, [], dtype or torch.get_default_dtype(), device)


@lower(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return constant_box(0, size, dtype or torch.get_default_dtype(), device)


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return constant_box(1, size, dtype or torch.get_default_dtype(), device)


@lower(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return constant_box(fill_value, x.get_size(), dtype or x.dtype, device or x.device)


@lower(aten.zeros_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return constant_box(0, x.get_size(), dtype or x.dtype, device or x.device)


@lower(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return constant_box(1, x.get_size(), dtype or x.dtype, device or x.device)


@lower(aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default)
def empty(size, *_layout, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """Uninitialized memory may hold anything; zeros cost nothing unless read (a `*_like` of it reads only
    its size). A graph output keeps the strides eager gives it (GraphLowering stores outputs that way)."""
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")
    return constant_box(0, size, dtype or torch.get_default_dtype(), device)


@lower(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    """empty_strided with x's dtype and device by default (a backward's buffer for a view's gradient)."""
    return empty(size, stride, dtype=dtype or x.dtype, layout=layout, device=device or x.device)


@lower(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = {1: lambda: (0, args[0], 1), 2: lambda: (args[0], args[1], 1),
                        3: lambda: (args[0], args[1], args[2])}[len(args)]()
    if any(isinstance(v, float) for v in (start, end, step)):
        raise Unsupported("float arange")  # its length rounding is subtle; ATen does it right
    if dtype is None:
        dtype = torch.int64
    start, end, step = sympify(start), sympify(end), sympify(step)
    length = sympy.Max(0, FloorDiv(end - start + step - 1, step)) if step.is_positive else \
        sympy.Max(0, FloorDiv(start - end - step - 1, -step))
    length = sympy.simplify(length)

    def inner_fn(idx):
        return index_value(start + idx[0] * step, dtype)
    return TensorBox.pointwise(canonical_device(device), dtype, inner_fn, [length])


@lower(prims.iota.default)
def iota(length, *, start, step, dtype, device, requires_grad=False):
    return TensorBox.pointwise(canonical_device(device), dtype,
                               lambda idx: index_value(sympify(start) + idx[0] * sympify(step), dtype),
                               [sympify(length)])
