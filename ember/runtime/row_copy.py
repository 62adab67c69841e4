"""A hand-written Triton kernel that copies the first n columns of each row of a 2-D CUDA tensor into a
dense one: the chunk copies of ember::padded_mm and chunk_padded_mm (graph/custom_ops.py). Its rows are
misaligned on one side (GPT-2's 50257 columns), where ATen's strided copy runs well below the copy
bandwidth; a kernel per (row, column block) streams them at the bandwidth (docs/performance.md;
`python -m experiments.matmul_pad_probe`)."""
from __future__ import annotations

import functools

import torch

_BLOCK = 2048


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows(src, dst, n, src_stride, dst_stride, BLOCK: tl.constexpr):
        row = tl.program_id(1).to(tl.int64)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < n
        tl.store(dst + row * dst_stride + cols, tl.load(src + row * src_stride + cols, mask=keep), mask=keep)
    return copy_rows


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:] = src for 2-D tensors of one shape whose rows are contiguous; a Triton kernel on CUDA."""
    rows, n = dst.shape
    if dst.device.type != "cuda" or rows > 65535 or dst.stride(1) != 1 or src.stride(1) != 1:
        dst.copy_(src)
        return
    _kernel()[(-(-n // _BLOCK), rows)](src, dst, n, src.stride(0), dst.stride(0), BLOCK=_BLOCK, num_warps=8)
