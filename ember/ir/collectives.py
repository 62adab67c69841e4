"""Collectives in the loop IR: a functional collective is issued by one extern call and completed by a
`wait_tensor` on its output, with work on other values free to run in between.

Between the two, the collective's output is being written and its inputs read by the communication
library: neither may be read, written or given to another buffer. The IR states that with data the
scheduler and the memory planner already follow:

- a `CollectiveKernel` writes its output buffer (or, for a `_coalesced` collective, one MultiOutput per
  tensor);
- a `WaitKernel` writes the tensor it waits on (so every reader of the waited value runs after it, as
  after any writer) and reads the collective's inputs as well as its output (so no input is freed, reused
  or overwritten before the collective is complete). `wait_tensor` returns its input: the lowering hands
  on the waited buffer itself, and the wait binds no buffer of its own.
"""
from __future__ import annotations

from typing import Optional

from .nodes import ExternKernel, MultiOutput, ReinterpretView


class CollectiveKernel(ExternKernel):
    """Issues a collective (`_c10d_functional.all_reduce`, `all_gather_into_tensor`, ...). `group` is
    the process group's name, as the op takes it."""

    def __init__(self, name, layout, op, args, kwargs, group, mutated=()):
        super().__init__(name, layout, op, args, kwargs, mutated)
        self.group = group


class WaitKernel(ExternKernel):
    """`wait_tensor` on a collective's output (or on a tensor a collective outside the graph returned)."""

    def __init__(self, name, op, waited, issued_by: Optional[CollectiveKernel]):
        base = waited.data if isinstance(waited, ReinterpretView) else waited
        super().__init__(name, None, op, [waited], {}, [base.storage_name()])
        self.waited = waited            # the Buffer (or ReinterpretView) whose value is complete after it
        self.issued_by = issued_by      # None for a tensor whose collective is not in this graph

    def input_nodes(self) -> list:
        inputs = super().input_nodes()
        if self.issued_by is not None:
            inputs += self.issued_by.input_nodes()
        return inputs


def issuing_collective(buf, buffers) -> Optional[CollectiveKernel]:
    """The collective that writes `buf`: the one whose output it is (directly, or one tensor of a
    coalesced collective), else the latest of `buffers` (the graph's, in order) that writes it in place."""
    if isinstance(buf, MultiOutput):
        buf = buf.parent
    if isinstance(buf, CollectiveKernel):
        return buf
    name = buf.storage_name()
    return next((b for b in reversed(buffers) if isinstance(b, CollectiveKernel) and name in b.mutated), None)
