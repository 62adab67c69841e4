"""Launching a compiled Triton kernel through torch's C launcher (`torch._C._StaticCudaLauncher`).

Triton's own launcher for a compiled kernel (`CompiledKernel.run`) is a Python function that looks up
scratch allocators and builds closures on every call, then a C function that parses the arguments by
the kernel's signature and asks the driver about every pointer: ~4.5 us of host time per launch on the
GPU machines we measure on. torch ships a C launcher that takes the loaded function handle, the block
shape and a type string, and parses plain integers; what it needs is fixed once a kernel is compiled,
so `static_launch(kernel)` derives it once and returns `go(grid_x, grid_y, grid_z, stream, args)`.

The handle is Triton's own (`kernel.function`, loaded for the device the kernel was compiled on, with
its dynamic shared memory already raised where the kernel needs it); nothing is loaded twice.

The compiled function's parameters are the call's arguments minus the constexprs and the arguments
Triton specialised into constants (an integer equal to 1), plus a pointer per scratch area the Triton
version declares (global, profile: null, as Triton passes them when the size is 0). Pointers are passed
as integers (`data_ptr()`), so the C side does not query the driver about them. A kernel whose launch
needs more than this (scratch memory, several CTAs per program, cooperative or PDL launches, tensor
descriptors, a parameter type without a C code here) gets None, and launches through Triton as before.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

# Triton signature type -> the C launcher's type code
_TYPE_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
               "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}


def c_launcher():
    """torch's C launcher entry, or None (a CPU build, a torch without it)."""
    launcher = getattr(torch._C, "_StaticCudaLauncher", None)
    return getattr(launcher, "_launch_kernel", None)


def _meta(kernel, name, default=None):
    return getattr(kernel.metadata, name, default)


def _unsupported(kernel) -> Optional[str]:
    """Why this compiled kernel cannot go through the C launcher, or None."""
    if getattr(kernel, "function", None) is None or not hasattr(kernel, "metadata") or not hasattr(kernel, "src"):
        return "not a compiled kernel with a loaded function handle"
    if _meta(kernel, "num_ctas", 1) != 1:
        return "several CTAs per program"
    if _meta(kernel, "launch_cooperative_grid", False) or _meta(kernel, "launch_pdl", False):
        return "a cooperative or PDL launch"
    if _meta(kernel, "tensordesc_meta"):
        return "tensor descriptors"
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if (_meta(kernel, scratch) or 0) > 0:
            return f"{scratch} > 0"
    return None


def parameter_layout(src, n_args: int) -> Optional[tuple[list[int], str]]:
    """(positions of the call's arguments that the compiled function takes, their type codes), from the
    compiled source's signature (names or positions -> Triton type) and constants; None when a type has
    no code."""
    names = list(src.fn.arg_names)
    position = lambda k: names.index(k) if isinstance(k, str) else (k[0] if isinstance(k, tuple) else k)  # noqa: E731
    types = {position(k): t for k, t in src.signature.items()}
    constants = {position(k) for k in getattr(src, "constants", {})}
    keep, codes = [], []
    for i in range(n_args):
        t = types.get(i)
        if t is None or t == "constexpr" or i in constants:
            continue
        code = "O" if t.startswith("*") else _TYPE_CODES.get(t)
        if code is None:
            return None
        keep.append(i)
        codes.append(code)
    return keep, "".join(codes)


def _selector(keep: list[int], codes: str, n_scratch: int) -> Callable:
    """select(args) -> the tuple the C launcher takes: pointers as integers, scratch pointers null."""
    parts = [f"a[{i}].data_ptr()" if c == "O" else f"a[{i}]" for i, c in zip(keep, codes)] + ["None"] * n_scratch
    scope: dict = {}
    exec(f"def select(a):\n    return ({''.join(p + ', ' for p in parts)})\n", scope)
    return scope["select"]


def static_launch(kernel, n_args: int) -> Optional[Callable]:
    """go(grid_x, grid_y, grid_z, stream, args) launching `kernel` (a Triton CompiledKernel) through torch's
    C launcher, or None where it cannot (see the module docstring)."""
    launch = c_launcher()
    if launch is None or _unsupported(kernel) is not None:
        return None
    layout = parameter_layout(kernel.src, n_args)
    if layout is None:
        return None
    keep, codes = layout
    # a Triton that declares a scratch area's size also gives the function a pointer parameter for it
    n_scratch = sum(hasattr(kernel.metadata, s) for s in ("global_scratch_size", "profile_scratch_size"))
    codes += "O" * n_scratch
    select = _selector(keep, codes, n_scratch)
    function, warps, shared = kernel.function, _meta(kernel, "num_warps"), _meta(kernel, "shared")

    def go(gx, gy, gz, stream, args):
        launch(function, gx, gy, gz, warps, shared, codes, select(args), stream)
    return go
