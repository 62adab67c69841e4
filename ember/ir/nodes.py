"""The loop-level IR.

A value being lowered is a TensorBox around one of:
  Pointwise    ranges + inner_fn(index) -> value           (not yet stored anywhere)
  Reduction    ranges + reduction_ranges + inner_fn(index, rindex), reduced by reduction_type
  Scan         ranges (the rows) + scan_length + inner_fn(index, sindex), an inclusive scan along one dim
  Buffer       memory with a Layout: InputBuffer, ComputedBuffer (a realized Loops), ExternKernel
               (an ATen call), MultiOutput (one tensor of an extern's tuple), MutationBuffer,
               ScatterBuffer (writes at computed positions of another buffer)
  ReinterpretView  a strided view of a Buffer's storage (never copies)

Realizing a TensorBox turns its Loops into a ComputedBuffer registered with the graph; every consumer
lowered afterwards loads from it instead of recomputing.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import sympy
import torch

from .. import state
from .ops import ops
from .symbolic import Expr, Remembered, contiguous_strides, product, sympify


@dataclasses.dataclass
class Layout:
    device: torch.device
    dtype: torch.dtype
    size: list
    stride: list
    offset: Expr = sympy.Integer(0)

    def index(self, idx: Sequence[Expr]) -> Expr:
        assert len(idx) == len(self.stride), (idx, self.stride)
        return _position(tuple(idx), tuple(self.size), tuple(self.stride), self.offset, None)

    def relative_index(self, idx: Sequence[Expr], base: Expr) -> Expr:
        """index(idx) - base: the position relative to a storage offset `base` (where a kernel's pointer
        points)."""
        assert len(idx) == len(self.stride), (idx, self.stride)
        return _position(tuple(idx), tuple(self.size), tuple(self.stride), self.offset, base)

    def numel(self) -> Expr:
        return product(self.size)

    def storage_size(self) -> Expr:
        """Elements of storage this layout spans (offset included)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + sum(((n - 1) * s for n, s in zip(self.size, self.stride)), sympy.Integer(0)) + 1

    def is_contiguous(self) -> bool:
        return all(n == 1 or st == c for n, st, c in zip(self.size, self.stride, contiguous_strides(self.size)))

    @staticmethod
    def contiguous(device, dtype, size) -> "Layout":
        size = [sympify(s) for s in size]
        return Layout(device, dtype, size, contiguous_strides(size))

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "Layout":
        return Layout(t.device, t.dtype, [sympify(s) for s in t.size()], [sympify(s) for s in t.stride()],
                      sympify(t.storage_offset()))


def _compute_position(idx, size, stride, offset, base) -> Expr:
    """offset + sum(i * s) over the dims of size other than 1, less `base` (unless None)."""
    out = offset
    for i, s, n in zip(idx, stride, size):
        if n != 1:  # size-1 dims never move the index, whatever their stride
            out = out + i * s
    return out if base is None else out - base


_position = Remembered(_compute_position)


class IRNode:
    dtype: torch.dtype
    device: torch.device

    def get_size(self) -> list:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        return self.dtype

    def get_device(self) -> torch.device:
        return self.device

    def make_loader(self) -> Callable:
        raise NotImplementedError

    def numel(self) -> Expr:
        return product(self.get_size())


# --- unrealized computations ------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class Loops(IRNode):
    device: torch.device
    dtype: torch.dtype
    inner_fn: Callable
    ranges: list

    def get_size(self):
        return self.ranges


class Pointwise(Loops):
    # (base TensorBox, layout_fn) where this Pointwise is a view of a value not stored when the view was
    # taken: lowering/views.stored_view can store the base and make the view a ReinterpretView of it
    view_of = None
    # the stored TensorBox this Pointwise casts to another float dtype, if that is all it does
    cast_of = None

    def make_loader(self):
        return self.inner_fn


@dataclasses.dataclass(eq=False)
class Reduction(Loops):
    reduction_ranges: list = dataclasses.field(default_factory=list)
    reduction_type: str = "sum"
    src_dtype: torch.dtype = torch.float32
    output_index: Optional[int] = None   # which value of a tuple reduction (ir.ops.TUPLE_REDUCTIONS)

    def make_loader(self):
        raise RuntimeError("a Reduction must be realized before it is read")

    def body(self, index, rindex):
        value = ops.reduction(self.dtype, self.src_dtype, self.reduction_type, self.inner_fn(index, rindex))
        if self.output_index is not None:
            value = value[self.output_index]
        return value


@dataclasses.dataclass(eq=False)
class Scan(Loops):
    """An inclusive scan along one dim (cumsum, cumprod, logcumsumexp). `ranges` are the other dims (the
    rows), `scan_length` the scanned dim's size and `scan_dim` its position in the output;
    `inner_fn(index, sindex)` gives the value at row `index`, step `sindex[0]`; `combine` is one of
    ops.SCAN_COMBINES. Kernels run it along their r axis, so it is realized as soon as it is built."""
    scan_length: Expr = sympy.Integer(1)
    scan_dim: int = 0
    combine: str = "add"

    def get_size(self):
        return self.output_index(self.ranges, [self.scan_length])

    def make_loader(self):
        raise RuntimeError("a Scan must be realized before it is read")

    def output_index(self, index, sindex) -> list:
        return list(index[:self.scan_dim]) + [sindex[0]] + list(index[self.scan_dim:])

    def body(self, index, sindex):
        return ops.scan(self.dtype, self.combine, self.inner_fn(index, sindex))


# --- memory ------------------------------------------------------------------------------------------

class Buffer(IRNode):
    # kernels read single elements of this buffer at constant positions, the one thing that differs between
    # otherwise identical kernels (a seed per random op, lowering/random.py): a kernel backend with
    # `element_arguments` takes such a position as a launch argument, so repeated layers share one kernel
    elements_vary = False

    def __init__(self, name: Optional[str], layout: Optional[Layout]):
        self.name = name
        self.layout = layout

    @property
    def dtype(self):
        return self.layout.dtype

    @property
    def device(self):
        return self.layout.device

    def get_size(self):
        return self.layout.size

    def get_name(self) -> str:
        return self.name

    def storage_name(self) -> str:
        """Name of the memory this buffer's loads and stores touch."""
        return self.name

    def make_loader(self):
        name, layout = self.storage_name(), self.layout
        return lambda idx: ops.load(name, layout.relative_index(idx, layout.offset))

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {self.layout.dtype if self.layout else None}, size={self.layout.size if self.layout else None})"


class InputBuffer(Buffer):
    pass


class ConstantBuffer(InputBuffer):
    """A tensor attribute of the graph module (get_attr), passed to the wrapper as a constant."""

    def __init__(self, name, layout, value: torch.Tensor):
        super().__init__(name, layout)
        self.value = value


class ComputedBuffer(Buffer):
    def __init__(self, name, layout, data: Loops):
        super().__init__(name, layout)
        self.data = data

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def store_body(self, index, rindex=()):
        """Run the computation for one output element (and one reduction element) and store it."""
        # kernels get the tensor itself, whose data pointer already includes its storage offset
        if isinstance(self.data, Scan):
            idx = self.layout.relative_index(self.data.output_index(index, rindex), self.layout.offset)
            return ops.store(self.storage_name(), idx, self.data.body(index, rindex))
        idx = self.layout.relative_index(index, self.layout.offset)
        if isinstance(self.data, Reduction):
            return ops.store_reduction(self.storage_name(), idx, self.data.body(index, rindex))
        return ops.store(self.storage_name(), idx, self.data.inner_fn(index))


class MutationBuffer(ComputedBuffer):
    """Writes its value into an existing buffer's storage (an input mutated in place, `copy_`)."""

    def __init__(self, name, target: Buffer, data: Loops):
        super().__init__(name, target.layout, data)
        self.target = target

    def storage_name(self):
        return self.target.storage_name()


class ScatterBuffer(MutationBuffer):
    """Writes `data` (computed over its own iteration space, a scatter's source) into `target` at
    positions the body computes: `indexer(index)` is the target position of element `index`, usually
    holding indirect indices. `mode` is the store mode (see ops.py): None, or "atomic_add" to
    accumulate. Only the positions written change: the target holds its fill from earlier kernels."""

    def __init__(self, name, target: Buffer, data: Loops, indexer: Callable, mode: Optional[str] = None):
        super().__init__(name, target, data)
        self.indexer, self.mode = indexer, mode

    def store_body(self, index, rindex=()):
        idx = self.layout.relative_index(self.indexer(index), self.layout.offset)
        return ops.store(self.storage_name(), idx, self.data.inner_fn(index), mode=self.mode)


class ExternKernel(Buffer):
    """A call to an ATen op (a fallback or an extern such as mm). `args`/`kwargs` hold IR nodes where
    the op takes tensors. Layout is None when the op returns a tuple (see MultiOutput)."""

    def __init__(self, name, layout, op, args, kwargs, mutated: Sequence[str] = ()):
        super().__init__(name, layout)
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.mutated = list(mutated)

    def input_nodes(self) -> list:
        out = []

        def visit(a):
            if isinstance(a, (Buffer, ReinterpretView)):
                out.append(a)
            elif isinstance(a, (list, tuple)):
                for b in a:
                    visit(b)
            elif isinstance(a, dict):
                for b in a.values():
                    visit(b)

        visit(self.args)
        visit(list(self.kwargs.values()))
        return out


class MultiOutput(Buffer):
    def __init__(self, name, layout, parent: ExternKernel, path: tuple):
        super().__init__(name, layout)
        self.parent = parent
        self.path = path


@dataclasses.dataclass(eq=False)
class ReinterpretView(IRNode):
    """A strided view onto a buffer's storage: permute, expand, slice, select ... of a realized value."""
    data: Buffer
    layout: Layout

    @property
    def dtype(self):
        return self.layout.dtype

    @property
    def device(self):
        return self.layout.device

    def get_size(self):
        return self.layout.size

    def get_name(self):
        return self.data.get_name()

    def make_loader(self):
        # relative to the base tensor's data pointer, which already includes the base's offset
        name, layout, base = self.data.storage_name(), self.layout, self.data.layout.offset
        return lambda idx: ops.load(name, layout.relative_index(idx, base))


# --- the box lowerings pass around ----------------------------------------------------------------------

class TensorBox:
    """A lowered tensor value. Realizing swaps `data` for a buffer in place, so every later reader loads
    the stored value."""

    def __init__(self, data: IRNode):
        self.data = data

    @staticmethod
    def pointwise(device, dtype, inner_fn, ranges) -> "TensorBox":
        return TensorBox(Pointwise(device, dtype, inner_fn, list(ranges)))

    def get_size(self):
        return self.data.get_size()

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    @property
    def dtype(self):
        return self.data.get_dtype()

    @property
    def device(self):
        return self.data.get_device()

    def dim(self):
        return len(self.get_size())

    def numel(self):
        return product(self.get_size())

    def make_loader(self):
        return self.data.make_loader()

    def is_realized(self) -> bool:
        return isinstance(self.data, (Buffer, ReinterpretView))

    def realize(self) -> IRNode:
        """Store the value (if it is not stored yet) and return the Buffer or ReinterpretView."""
        if isinstance(self.data, Loops):
            g = state.current_graph()
            layout = Layout.contiguous(self.data.device, self.data.dtype, self.data.get_size())
            self.data = g.register_buffer(ComputedBuffer(None, layout, self.data))
        return self.data

    def __repr__(self):
        return f"TensorBox({self.data!r})"


def loops_of_realized(node: IRNode) -> Pointwise:
    """A Pointwise that reads `node` elementwise (to wrap a buffer into a fresh computation)."""
    loader = node.make_loader()
    return Pointwise(node.get_device(), node.get_dtype(), loader, list(node.get_size()))
