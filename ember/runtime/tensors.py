"""Allocating buffers and taking views of them with the least host time: what a wrapper does ~500 times in
a BERT training step. torch's C entry points for exactly these jobs (in `torch._C._dynamo.guards`, public
to compiled code since torch 2.3) skip the Python argument parser of `torch.empty_strided` and
`torch.as_strided`, which costs a good part of each call's host time (docs/performance.md, "Host time per
call"). Where a torch build lacks them, the public functions serve.

`fast_empty_strided(device_type)` allocates on the *current* device of that type: a wrapper uses it only for
buffers on the device that it runs with as current (codegen/wrapper/device_guard.py)."""
from __future__ import annotations

import torch

_guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_EMPTY = {"cuda": getattr(_guards, "_empty_strided_cuda", None), "cpu": getattr(_guards, "_empty_strided_cpu", None)}
_REINTERPRET = getattr(_guards, "_reinterpret_tensor", None)


def fast_empty_strided(device_type: str):
    """empty(size, stride, dtype) on the current device of device_type, or None where torch has none."""
    return _EMPTY.get(device_type)


def _as_strided_past(base, size, stride, offset):
    return torch.as_strided(base, size, stride, base.storage_offset() + offset)


# reinterpret(base, size, stride, offset): base's storage seen with other sizes and strides, starting
# `offset` elements past base's own storage offset (torch's C entry takes the offset as that increment).
# Not an autograd view: a wrapper runs with no tensor requiring grad (AOTAutograd's compiled functions,
# inference graphs)
reinterpret = _REINTERPRET or _as_strided_past
