"""The structure of a fused group, as a hashable key: two groups with the same key generate the same kernel
but for the buffers it reads and writes, so the second one can launch the first one's kernel (the same
layer, repeated) instead of generating, compiling, tuning and loading another copy.

The key is built from the kernel IR, never from generated text: every node's store body runs under a
recording handler that writes down each op with its arguments, buffer names replaced by their order of
first appearance in the group. Everything else that kernel generation reads goes in too: the group's
iteration space, each node's ranges, and per buffer its dtype, layout and whether it is kernel-local
(never stored). Anything the recorder does not know how to write down makes the group unkeyed (None):
such a group always gets a kernel of its own.

For a backend that takes element positions as launch arguments (`KernelBackend.element_arguments`), a load
of a constant element of a buffer whose elements vary (a random op's seed) is keyed by which element of the
group it is, not by its position: the layers' dropout kernels share one key, and `elements` lists the
positions each group passes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import sympy
import torch

from ..ir.ops import DefaultHandler, handler


@dataclasses.dataclass(frozen=True)
class GroupStructure:
    key: tuple               # hashable: equal keys generate equal kernels but for buffer names
    buffers: tuple           # buffer names in canonical order (the order the key numbers them)
    elements: tuple = ()     # (buffer name, position) of each element keyed by its order, in that order


class _Unkeyable(Exception):
    pass


class _Value:
    """A recorded op's result: its position in the trace (and, for a tuple result, the element)."""
    __slots__ = ("id",)

    def __init__(self, id_):
        self.id = id_

    def __getitem__(self, i):           # welford's and online softmax's tuple results
        return _Value((self.id, i))


class _StructureRecorder(DefaultHandler):
    def __init__(self, varying=lambda name: False):
        self.trace: list = []
        self.buffers: dict[str, int] = {}
        self.elements: dict[tuple, int] = {}     # (buffer name, position) -> order of first load
        self._varying = varying                  # buffer name -> whether its element positions are keyed by order
        self._indirect = 0

    def buffer(self, name: str) -> tuple:
        return ("buf", self.buffers.setdefault(name, len(self.buffers)))

    def _default(self, name, args, kwargs):
        self.trace.append((name, _norm(args), _norm(sorted(kwargs.items()))))
        return _Value(len(self.trace) - 1)

    def load(self, name, index):
        if isinstance(index, sympy.Integer) and self._varying(name):
            element = self.elements.setdefault((name, int(index)), len(self.elements))
            return self._default("load", (self.buffer(name), ("element", element)), {})
        return self._default("load", (self.buffer(name), index), {})

    def store(self, name, index, value, mode=None):
        self._default("store", (self.buffer(name), index, value, mode), {})

    def store_reduction(self, name, index, value):
        self._default("store_reduction", (self.buffer(name), index, value), {})

    def indirect_indexing(self, value, size, check=True):
        self._default("indirect_indexing", (value, size, check), {})
        self._indirect += 1
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)


def _norm(x):
    """A recorded argument in hashable, comparable form."""
    if isinstance(x, _Value):
        return ("v", x.id)
    if isinstance(x, (bool, int, str, type(None))):
        return x
    if isinstance(x, float):
        return ("f", repr(x))           # NaN equals itself this way
    if isinstance(x, sympy.Basic):
        # the expression itself: sympy's equality and hash are structural (assumptions of symbols included),
        # and comparing cached hashes costs far less than printing every index of every kernel
        return ("e", x)
    if isinstance(x, torch.dtype):
        return ("dt", str(x))
    if isinstance(x, (tuple, list)):
        return tuple(_norm(v) for v in x)
    raise _Unkeyable(type(x).__name__)


def group_structure(group, graph, local: set, backend) -> Optional[GroupStructure]:
    """The structural key of a kernel group (None: the group has something the recorder cannot key)."""
    rec = _StructureRecorder((lambda name: getattr(graph.get_buffer(name), "elements_vary", False))
                             if backend.element_arguments else (lambda name: False))
    nodes = []
    try:
        with handler(rec):
            for node in group.nodes:
                rec.buffer(node.name)
                node.buf.store_body(node.ivars, node.rvars)
                nodes.append((type(node.buf.data).__name__, _norm(node.ranges), _norm(node.rranges)))
        buffers = tuple(rec.buffers)
        layouts = tuple(_buffer_facts(graph, name, name in local) for name in buffers)
        key = (backend.name, str(group.device()), _norm(group.group), tuple(nodes), tuple(rec.trace), layouts)
        hash(key)
    except _Unkeyable:
        return None
    return GroupStructure(key, buffers, tuple(rec.elements))


def _buffer_facts(graph, name: str, local: bool) -> tuple:
    buf = graph.get_buffer(name)
    layout = getattr(buf, "layout", None)
    if layout is None:
        raise _Unkeyable(name)
    return (str(layout.dtype), _norm(list(layout.size)), _norm(list(layout.stride)), _norm(layout.offset), local)
