"""A hand-written Triton kernel that copies the first n columns of each row of a 2-D CUDA tensor into a
dense one: the chunk copies of ember::padded_mm and chunk_padded_mm (graph/custom_ops.py). Its rows are
misaligned on one side (GPT-2's 50257 columns), where ATen's strided copy runs well below the copy
bandwidth; a kernel per (row, column block) streams them at the bandwidth (docs/performance.md;
`python -m experiments.matmul_pad_probe`)."""
from __future__ import annotations

import os

import torch

from ..config import config
from .loader import load_triton_file

# one program per (row, BLOCK columns)
_META = {"BLOCK": 2048, "num_warps": 8}
# (dtype, n, source row stride, destination row stride) -> the kernel's launcher for such copies
_launchers: dict = {}


def _module():
    return load_triton_file(os.path.join(os.path.dirname(__file__), "row_copy_kernel.py"), "ember_row_copy")


def compile_ahead(dtype: torch.dtype, n: int, src_stride: int, dst_stride: int) -> None:
    """Have the compile workers build the copy of rows of `n` elements between these row strides, launched
    through their binary at its first call: without it that call compiles the kernel with Triton's JIT on
    the main thread (about a second of a cold GPT-2 training call on an H200) or, in a warm process, finds it
    in Triton's cache after computing Triton's cache key (a third of a second). A graph that will call the
    copy asks while it compiles (KernelBackend.runtime_row_copy_ahead); a warm process, at the first call,
    gets the workers' binary from the marker an earlier process left (runtime/compile_pool.py)."""
    key = (dtype, n, src_stride, dst_stride)
    if key in _launchers:
        return
    module = _module()
    fn = module.copy_rows
    if not config.fast_launch or not hasattr(fn, "params"):      # or Triton's interpreter runs it
        _launchers[key] = fn
        return
    from . import compile_pool
    from .launch import Launcher
    build = compile_pool.Build("copy_rows", compile_pool.WarmSpec([dtype, dtype, n, src_stride, dst_stride],
                                                                   [dict(_META)]))
    pending = compile_pool.precompile_ahead(module, None, [build], min_jobs=1)
    _launchers[key] = Launcher(fn, pending.get("copy_rows"), build.warm.args)


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:] = src for 2-D tensors of one shape whose rows are contiguous; a Triton kernel on CUDA."""
    rows, n = dst.shape
    if dst.device.type != "cuda" or rows > 65535 or dst.stride(1) != 1 or src.stride(1) != 1:
        dst.copy_(src)
        return
    key = (dst.dtype, n, src.stride(0), dst.stride(0))
    if key not in _launchers:
        compile_ahead(*key)
    _launchers[key][(-(-n // _META["BLOCK"]), rows)](src, dst, n, src.stride(0), dst.stride(0), **_META)
