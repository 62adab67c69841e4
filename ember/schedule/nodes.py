"""Scheduler nodes: one per realized buffer, with its reads, writes and iteration space.

A kernel iterates over a flat `xindex` (output elements or rows) and, for reductions, a flat `rindex`
(elements of a row; a scan's steps along its scanned dim). A node's own loop variables map onto those as
FloorDiv / ModularIndexing of the flat indices (`flat_vars`); `canonical` then rewrites any index of the
node in kernel terms, simplified, so two nodes' accesses can be compared and printed.
"""
from __future__ import annotations

from typing import Optional

import sympy
import torch

from ..ir.deps import MemoryDep, record
from ..ir.nodes import Buffer, ComputedBuffer, ExternKernel, MultiOutput, Reduction, ReinterpretView, Scan
from ..ir.symbolic import (FloorDiv, ModularIndexing, Remembered, contiguous_strides, make_index_vars, product,
                           simplify_index, statically_known_equal)

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)


class SchedulerNode:
    def __init__(self, buf: Buffer, order: int):
        self.buf = buf
        self.name = buf.get_name()
        self.order = order
        self.deps: set[SchedulerNode] = set()      # nodes that must run before this one
        self.users: set[SchedulerNode] = set()
        self.read_deps: list[MemoryDep] = []
        self.write_deps: list[MemoryDep] = []
        self.ranges: list = []
        self.rranges: list = []
        self.op_count = 0
        # split and flat_vars per kernel shape: fusion asks them for every candidate pair, codegen again
        self._splits: dict = {}
        self._flat_vars: dict = {}
        self._group = None
        if isinstance(buf, ComputedBuffer):
            data = buf.data
            self.ranges = list(data.ranges)
            self.rranges = list(data.reduction_ranges) if isinstance(data, Reduction) else \
                [data.scan_length] if isinstance(data, Scan) else []
            self.ivars = make_index_vars("i", len(self.ranges))
            self.rvars = make_index_vars("r", len(self.rranges))
            rec = record(buf.store_body, self.ivars, self.rvars)
            self.read_deps, self.write_deps, self.op_count = rec.reads, rec.writes, rec.op_count
            self.has_indirect = rec.has_indirect
            self.symbols = rec.symbols | _symbols_in(self.ranges + self.rranges)
            self.reads = {d.name for d in self.read_deps}
            self.writes = {d.name for d in self.write_deps}
        elif isinstance(buf, ExternKernel):
            self.symbols = _symbols_in([buf.args, list(buf.kwargs.values())])
            self.reads = {n.data.storage_name() if isinstance(n, ReinterpretView) else n.storage_name()
                          for n in buf.input_nodes()}
            self.writes = {buf.get_name()} | set(buf.mutated)
        elif isinstance(buf, MultiOutput):
            self.symbols = set()
            self.reads = {buf.parent.get_name()}
            self.writes = {buf.get_name()}
        else:
            raise TypeError(f"cannot schedule {buf!r}")

    def defined_symbols(self) -> set:
        """Size symbols first known from this node's output (unbacked sizes of data-dependent ops)."""
        if isinstance(self.buf, (ExternKernel, MultiOutput)) and self.buf.layout is not None:
            return {s for s in _symbols_in(self.buf.layout.size) if s.name.startswith("u")}
        return set()

    # -- kinds ----------------------------------------------------------------------------------------

    def is_kernel(self) -> bool:
        return isinstance(self.buf, ComputedBuffer)

    def is_reduction(self) -> bool:
        """Has an r axis: a reduction, or a scan."""
        return bool(self.rranges) or (isinstance(self.buf, ComputedBuffer) and
                                      isinstance(self.buf.data, (Reduction, Scan)))

    def is_scan(self) -> bool:
        return isinstance(self.buf, ComputedBuffer) and isinstance(self.buf.data, Scan)

    def device(self) -> torch.device:
        return self.buf.get_device()

    def group(self) -> tuple:
        """(xnumel, rnumel) of the kernel this node alone would be."""
        if self._group is None:
            r = product(self.rranges) if self.is_reduction() else sympy.Integer(1)
            self._group = (product(self.ranges), r)
        return self._group

    # -- placing into a kernel of shape (X, R) ------------------------------------------------------------

    def split(self, group) -> Optional[tuple]:
        """(x dims, r dims) of this node in a kernel of `group`, or None if it does not fit."""
        group = tuple(group)
        if group not in self._splits:
            self._splits[group] = self._split(group)
        return self._splits[group]

    def _split(self, group) -> Optional[tuple]:
        X, R = group
        if self.is_reduction():
            if statically_known_equal(product(self.ranges), X) and statically_known_equal(product(self.rranges), R):
                return (self.ranges, self.rranges)
            return None
        numel = product(self.ranges)
        if statically_known_equal(numel, X):
            return (self.ranges, [])
        if R != 1 and statically_known_equal(numel, X * R):
            acc = sympy.Integer(1)
            for k in range(len(self.ranges) + 1):
                if statically_known_equal(acc, X):
                    rest = self.ranges[k:]
                    if statically_known_equal(product(rest), R):
                        return (self.ranges[:k], rest)
                if k < len(self.ranges):
                    acc = acc * self.ranges[k]
        return None

    def flat_vars(self, group) -> Optional[dict]:
        """Substitution from this node's loop variables to kernel flat-index expressions."""
        group = tuple(group)
        if group not in self._flat_vars:
            self._flat_vars[group] = self._compute_flat_vars(group)
        subs = self._flat_vars[group]
        return None if subs is None else dict(subs)

    def _compute_flat_vars(self, group) -> Optional[dict]:
        sp = self.split(group)
        if sp is None:
            return None
        xdims, rdims = sp
        vars_ = self.ivars + self.rvars if self.is_reduction() else self.ivars
        subs = {}
        for dims, flat, names in ((xdims, XINDEX, vars_[:len(xdims)]), (rdims, RINDEX, vars_[len(xdims):])):
            strides = contiguous_strides(dims)
            for k, (v, n, st) in enumerate(zip(names, dims, strides)):
                if n == 1:
                    subs[v] = sympy.Integer(0)
                elif k == 0:
                    subs[v] = FloorDiv(flat, st)
                else:
                    subs[v] = ModularIndexing(flat, st, n)
        return subs

    def is_x_only(self, group) -> bool:
        sp = self.split(group)
        return sp is not None and not self.is_reduction() and not sp[1]


def canonical(expr, subs: dict, group) -> sympy.Expr:
    return _canonical(expr, tuple(subs.items()), tuple(group))


def _compute_canonical(expr, subs: tuple, group: tuple) -> sympy.Expr:
    X, R = group
    e = sympy.sympify(expr).xreplace(dict(subs))
    return simplify_index(e, ((XINDEX, X), (RINDEX, R)))


# fusion's checks, the memory planner and the kernel backends ask for the same accesses in the same kernels
_canonical = Remembered(_compute_canonical)


def kernel_index_vars(node: SchedulerNode, group):
    """The node's loop variables as kernel expressions: (x index list, r index list)."""
    subs = node.flat_vars(group)
    ivals = [subs[v] for v in node.ivars]
    rvals = [subs[v] for v in node.rvars]
    if not node.is_reduction():
        return ivals, []
    return ivals, rvals


def _symbols_in(obj) -> set:
    if isinstance(obj, sympy.Basic):
        return {x for x in obj.free_symbols if x.name[0] in "su"}
    if isinstance(obj, (list, tuple)):
        return set().union(set(), *(_symbols_in(o) for o in obj))
    return set()
