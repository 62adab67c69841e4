"""Run-time checks the generated wrapper calls."""
from __future__ import annotations

import torch


def check_layout(t: torch.Tensor, size, stride, name: str) -> None:
    """An extern (ATen) output must have the layout ember's kernels will read it with. Its layout comes
    from the op's meta function, which can disagree with the real kernel (seen with cuDNN attention):
    raise instead of reading it wrongly. Strides of size-1 dims never matter and are not compared."""
    if t is None:
        return          # an optional output the op left undefined (cuDNN attention's debug mask ...)
    size, stride = tuple(size), tuple(stride)
    if tuple(t.size()) != size or any(n != 1 and a != b for n, a, b in zip(size, t.stride(), stride)):
        raise AssertionError(f"ember: {name} has an unexpected layout: size {tuple(t.size())} stride "
                             f"{tuple(t.stride())}, expected size {size} stride {stride}")
