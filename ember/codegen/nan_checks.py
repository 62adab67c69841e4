"""config.check_nans: which values each kernel and extern call writes, and which FX nodes and user source
lines they come from, as the FiniteCheck the wrapper runs after the call (runtime/checks.py: check_finite).

Only values ember computes are checked: graph inputs (and constants) never are, nor a graph input that a
call updates in place, whose elements the call does not write may hold the caller's NaN. A value computed
from an input's NaN is reported at the call that writes it, and the error says which tensors the call read
held NaN or Inf already (FiniteCheck.reads)."""
from __future__ import annotations

from typing import Optional

import torch

from ..graph.passes.common import returns_fresh_memory
from ..ir.nodes import Buffer, ExternKernel, TensorBox
from ..lowering.graph_lowering import user_source_line
from .wrapper.lines import CallExtern, CallKernel, FiniteCheck, Name, device_call_label


class ValueOrigins:
    def __init__(self, lowering):
        self.g = lowering
        # buffer name -> the FX node whose lowered value is that buffer. A buffer's `origin` is the node being
        # lowered when it was realized, which is its consumer where a consumer forced it into memory (an
        # extern's argument), or the graph's output node for a returned value; the lowered values name the
        # node that computed it.
        self.producers: dict = {}
        for node, value in getattr(lowering, "env", {}).items():
            if isinstance(value, TensorBox) and isinstance(value.data, Buffer):
                self.producers.setdefault(value.data.get_name(), node)

    def fx_node(self, buf: Buffer) -> Optional[torch.fx.Node]:
        return self.producers.get(buf.get_name()) or getattr(buf, "origin", None)

    def describe(self, name: str, buf: Buffer) -> str:
        """'buf3 (FX node exp, from user code: File "m.py", line 12, in forward :: y = x.exp())'"""
        node = self.fx_node(buf)
        if node is None:
            return name
        where = user_source_line(node)
        return f"{name} (FX node {node.name}" + (f", from user code: {where})" if where else ")")

    def _computed_by_ember(self, buf: Buffer) -> bool:
        return buf.storage_name() not in self.g.graph_inputs

    def _check(self, call, computes: list, written: list) -> Optional[FiniteCheck]:
        """`computes`: the buffers of the call (for the FX nodes it names); `written`: (wrapper name, the
        buffer holding the value, the buffer whose FX node wrote it) of each value to check."""
        written = [w for w in written if _may_hold_nan(w[1])]
        if not written:
            return None
        nodes = list(dict.fromkeys(n.name for n in (self.fx_node(b) for b in computes) if n is not None))
        label = device_call_label(call)
        what = f"{label} (fx nodes: {', '.join(nodes)})" if nodes else label
        names = tuple(n for n, _, _ in written)
        args = list(call.args) + (list(call.kwargs.values()) if isinstance(call, CallExtern) else [])
        reads = tuple(dict.fromkeys(n for n in _names(args) if n not in names))
        return FiniteCheck(what, names, tuple(self.describe(n, w) for n, _, w in written), reads)

    def kernel_check(self, call: CallKernel, group, stored: set) -> Optional[FiniteCheck]:
        """What `call`, a kernel launched for `group`, writes to memory (`stored`: the buffer names it stores)."""
        written = {}
        for n in group.nodes:
            buf = n.buf
            if (n.name in stored or buf.storage_name() in stored) and self._computed_by_ember(buf):
                written.setdefault(buf.storage_name(), buf)
        return self._check(call, [n.buf for n in group.nodes], [(n, b, b) for n, b in written.items()])

    def extern_check(self, call: CallExtern, buf: ExternKernel) -> Optional[FiniteCheck]:
        """An extern's result (unless it may alias an argument, which may be a graph input) and the buffers
        of ember's it mutates."""
        written = [(buf.get_name(), buf, buf)] if returns_fresh_memory(buf.op) else []
        for name in buf.mutated:
            target = self.g.get_buffer(name)
            if isinstance(target, Buffer) and self._computed_by_ember(target):
                written.append((target.storage_name(), target, buf))
        return self._check(call, [buf], written)


def _names(value) -> list:
    """The wrapper names in a call's arguments (nested in lists and dicts for an extern)."""
    if isinstance(value, Name):
        return [str(value)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _names(v)]
    if isinstance(value, dict):
        return _names(list(value.values()))
    return []


def _may_hold_nan(buf: Buffer) -> bool:
    """Floating and complex values can; a tuple result (no layout) is sorted out at run time."""
    layout = buf.layout
    return layout is None or layout.dtype.is_floating_point or layout.dtype.is_complex

