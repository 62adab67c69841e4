"""Reads and writes of a computation, found by running its inner_fn under a recording handler."""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy

from .ops import DefaultHandler, handler
from .symbolic import Expr, free_symbols, make_index_vars, size_symbols


@dataclasses.dataclass(frozen=True)
class MemoryDep:
    name: str
    index: Expr


class _Value:
    """What the recording handler's ops return: nothing but a marker."""
    __slots__ = ()

    def __getitem__(self, i):  # welford's tuple result
        return self


_V = _Value()


class RecordingHandler(DefaultHandler):
    def __init__(self):
        self.reads: list[MemoryDep] = []
        self.writes: list[MemoryDep] = []
        self.op_count = 0
        self.has_indirect = False
        self._indirect = 0
        self.symbols: set = set()      # size symbols the body uses (an op defining them must run first)

    def _default(self, name, args, kwargs):
        self.op_count += 1
        return _V

    def _note(self, expr):
        self.symbols.update(size_symbols(expr))

    def index_expr(self, expr, dtype):
        self._note(expr)
        self.op_count += 1
        return _V

    def load(self, name, index):
        self._note(index)
        self.reads.append(MemoryDep(name, index))
        self.op_count += 1
        return _V

    def store(self, name, index, value, mode=None):
        self._note(index)
        self.writes.append(MemoryDep(name, index))
        if mode is not None or any(s.name.startswith("indirect") for s in free_symbols(index)):
            # a read-modify-write, or a write to positions known only at run time: the buffer's earlier
            # contents are part of the result, so the store orders and fuses as a read of them too
            self.reads.append(MemoryDep(name, index))
        return None

    store_reduction = store

    def indirect_indexing(self, value, size, check=True):
        self.has_indirect = True
        self._indirect += 1
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        self.op_count += 1
        return _V


def record(fn: Callable, *index_lists) -> RecordingHandler:
    """Run fn(*index_lists) under a recording handler."""
    h = RecordingHandler()
    with handler(h):
        fn(*index_lists)
    return h


def record_loops(inner_fn: Callable, ranges, reduction_ranges=None) -> RecordingHandler:
    idx = make_index_vars("i", len(ranges))
    if reduction_ranges is None:
        return record(inner_fn, idx)
    return record(inner_fn, idx, make_index_vars("r", len(reduction_ranges)))
