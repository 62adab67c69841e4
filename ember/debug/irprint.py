"""Readable text for the loop IR: each buffer with its layout and its body as a list of op calls."""
from __future__ import annotations

import itertools

from ..ir.nodes import ComputedBuffer, ExternKernel, MultiOutput, MutationBuffer, Reduction, Scan
from ..ir.ops import TUPLE_REDUCTIONS, DefaultHandler, handler
from ..ir.symbolic import make_index_vars


class _Printer(DefaultHandler):
    def __init__(self):
        self.lines = []
        self.n = itertools.count()

    def _emit(self, text):
        name = f"v{next(self.n)}"
        self.lines.append(f"{name} = {text}")
        return name

    def _default(self, name, args, kwargs):
        return self._emit(f"{name}({', '.join(map(_fmt, args))})")

    def reduction(self, dtype, src_dtype, rtype, value):
        out = self._emit(f"reduction({rtype}, {value})")
        return _Tuple(out) if rtype in TUPLE_REDUCTIONS else out

    def store(self, name, index, value, mode=None):
        self.lines.append(f"store({name}, {index}, {value}{f', mode={mode}' if mode else ''})")

    store_reduction = store

    def indirect_indexing(self, value, size, check=True):
        import sympy
        return sympy.Symbol(f"indirect_{value}")


class _Tuple(str):
    def __getitem__(self, i):
        return f"{str(self)}[{i}]"


def _fmt(a):
    return str(a).replace("torch.", "")


def describe_buffer(buf) -> str:
    head = f"{buf.get_name()}: {type(buf).__name__}"
    if buf.layout is not None:
        l = buf.layout
        head += f" {_fmt(l.dtype)}{list(l.size)} stride={list(l.stride)} on {l.device}"
    if isinstance(buf, MutationBuffer):
        head += f" (writes into {buf.storage_name()})"
    if isinstance(buf, ExternKernel):
        return head + f"\n    = {buf.op}({', '.join(_fmt(getattr(a, 'name', a)) for a in buf.args)})"
    if isinstance(buf, MultiOutput):
        return head + f"\n    = {buf.parent.get_name()}{list(buf.path)}"
    if isinstance(buf, ComputedBuffer):
        data = buf.data
        idx = make_index_vars("i", len(data.ranges))
        ridx = make_index_vars("r", len(data.reduction_ranges)) if isinstance(data, Reduction) else []
        head += f"\n    ranges={list(data.ranges)}"
        if isinstance(data, Reduction):
            head += f" reduction_ranges={list(data.reduction_ranges)} type={data.reduction_type}"
        if isinstance(data, Scan):
            ridx = make_index_vars("r", 1)
            head += f" scan_length={data.scan_length} at dim {data.scan_dim} combine={data.combine}"
        p = _Printer()
        with handler(p):
            buf.store_body(idx, ridx)
        head += "".join(f"\n    {ln}" for ln in p.lines)
    return head


def describe_buffers(buffers) -> str:
    return "\n".join(describe_buffer(b) for b in buffers) + "\n"


def describe_groups(groups) -> str:
    out = []
    for i, g in enumerate(groups):
        kind = "kernel" if g.is_kernel() else "extern"
        out.append(f"group {i} ({kind}, xnumel={g.group[0]}, rnumel={g.group[1]}): {[n.name for n in g.nodes]}")
    return "\n".join(out) + "\n"
