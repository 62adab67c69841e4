"""The bytes a device call moves, for config.report's roofline columns (the ProfiledCall of a wrapper line).

A kernel reads each buffer behind an input pointer of its signature and writes each buffer behind an
output pointer (an in-out pointer counts both ways), each once: the fewest bytes the call must move,
which is what a memory roofline compares with. A buffer counts by its distinct elements, and by no more
than the kernel's iteration space (X * R), so a kernel reading one slice of a larger buffer is not charged
for the rest. An extern call reads each tensor argument once and writes its results and what it mutates.
Sizes are the compile-time hints where they are symbolic."""
from __future__ import annotations

from ..ir.nodes import Buffer, ExternKernel, MultiOutput, ReinterpretView
from ..ir.symbolic import hint


def distinct_bytes(layout) -> int:
    """Bytes of the distinct elements a layout addresses (a broadcast dim, stride 0, adds none)."""
    if layout is None:
        return 0
    elements = min(hint(layout.numel()), hint(layout.storage_size() - layout.offset))
    return max(elements, 0) * layout.dtype.itemsize


def kernel_bytes(lowering, signature, args, group) -> tuple[int, int]:
    """(read, written) by a kernel call: `args` the call's arguments, in `signature`'s pointer order."""
    if signature is None:
        return 0, 0
    space = hint(group.group[0]) * hint(group.group[1])
    read = written = 0
    for param, name in zip(signature.pointers, args):
        layout = lowering.get_buffer(str(name)).layout
        moved = min(distinct_bytes(layout), space * layout.dtype.itemsize)
        if param.startswith("in_"):            # in_ptr, in_out_ptr
            read += moved
        if "out_ptr" in param:                 # out_ptr, in_out_ptr
            written += moved
    return read, written


def extern_bytes(lowering, buf: ExternKernel) -> tuple[int, int]:
    """(read, written) by an extern call: its tensor arguments once each; its results (the MultiOutputs of
    a tuple result) and the buffers it mutates."""
    seen, read = set(), 0
    for a in buf.input_nodes():
        key = (a.get_name(), id(a.layout)) if isinstance(a, ReinterpretView) else a.get_name()
        if key not in seen:
            seen.add(key)
            read += distinct_bytes(a.layout)
    if buf.layout is not None:
        written = distinct_bytes(buf.layout)
    else:
        written = sum(distinct_bytes(b.layout) for b in lowering.buffers
                      if isinstance(b, MultiOutput) and b.parent is buf)
    for name in buf.mutated:
        target = lowering.get_buffer(name)
        written += distinct_bytes(target.layout) if isinstance(target, Buffer) else 0
    return read, written
