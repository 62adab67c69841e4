"""The row copy's Triton kernel (runtime/row_copy.py). Loaded from this file's source by ember's loader, so
that its path names its source, and built by the compile workers as a generated kernel is."""
import triton
import triton.language as tl


@triton.jit
def copy_rows(src, dst, n, src_stride, dst_stride, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n
    tl.store(dst + row * dst_stride + cols, tl.load(src + row * src_stride + cols, mask=keep), mask=keep)
