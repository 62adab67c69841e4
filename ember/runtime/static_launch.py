"""Launching a compiled Triton kernel through torch's C launcher (`torch._C._StaticCudaLauncher`).

Triton's own launcher for a compiled kernel (`CompiledKernel.run`) is a Python function that looks up
scratch allocators and builds closures on every call, then a C function that parses the arguments by
the kernel's signature and asks the driver about every pointer, all host time on every launch
(docs/performance.md, "One launch, piece by piece"). torch ships a C launcher that takes the loaded
function handle, the block shape and a type string, and parses plain integers; what it needs is fixed
once a kernel is compiled, so `static_launch(kernel, ...)` derives it once and returns
`go(grid, stream, args)`.

The handle is Triton's own (`kernel.function`, loaded for the device the kernel was compiled on, with
its dynamic shared memory already raised where the kernel needs it); nothing is loaded twice.

The compiled function's parameters are the call's arguments minus the constexprs and the arguments
Triton specialised into constants (an integer equal to 1), plus a pointer per scratch area the Triton
version declares (global, profile: null, as Triton passes them when the size is 0). Pointers come as
integers (the caller read each `data_ptr()` once), so the C side does not query the driver about them. A kernel whose launch
needs more than this (scratch memory, several CTAs per program, cooperative or PDL launches, tensor
descriptors, a parameter type without a C code here) gets None, and launches through Triton as before.
"""
from __future__ import annotations

import hashlib
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
    if getattr(kernel, "function", None) is None:
        return "not a compiled kernel with a loaded function handle"
    return unsupported_binary(kernel)


def unsupported_binary(kernel) -> Optional[str]:
    """Why this compiled kernel's binary cannot go through the C launcher once loaded, or None (from its
    metadata alone: a compile worker asks before any function is loaded)."""
    if not hasattr(kernel, "metadata") or not hasattr(kernel, "src"):
        return "not a compiled kernel"
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


def static_launch(kernel, n_args: int, grid_rank: int) -> Optional[Callable]:
    """go(grid, stream, args) launching `kernel` (a Triton CompiledKernel) over a grid of grid_rank dims
    through torch's C launcher, generated once (one frame a launch), or None where it cannot (see the
    module docstring). `args` holds each tensor's data pointer (an int) in its place."""
    if c_launcher() is None or _unsupported(kernel) is not None:
        return None
    facts = _launch_facts(kernel, n_args)
    return None if facts is None else _generated(kernel.function, facts, grid_rank)


def _launch_facts(kernel, n_args: int) -> Optional[dict]:
    """What the C launcher needs to launch this compiled kernel's function: warps, shared memory, the
    positions of the call's arguments the function takes and their type codes (with a pointer per scratch
    area the Triton version declares); None where it cannot take it."""
    layout = parameter_layout(kernel.src, n_args)
    if layout is None:
        return None
    keep, codes = layout
    # a Triton that declares a scratch area's size also gives the function a pointer parameter for it
    n_scratch = sum(hasattr(kernel.metadata, s) for s in ("global_scratch_size", "profile_scratch_size"))
    return {"warps": _meta(kernel, "num_warps"), "shared": _meta(kernel, "shared"), "keep": keep,
            "codes": codes + "O" * n_scratch, "n_scratch": n_scratch}


def binary_facts(kernel, n_args: int) -> Optional[dict]:
    """`_launch_facts` plus the binary's file, its SHA-256 and its function name, as plain data: what a
    compile worker sends with each binary it builds (runtime/compile_pool.py), for a later process to load
    it. None where the C launcher cannot take it."""
    facts = _launch_facts(kernel, n_args) if unsupported_binary(kernel) is None else None
    if facts is None:
        return None
    group = getattr(kernel, "metadata_group", None) or {}
    binary = next((path for name, path in group.items() if name.endswith(".cubin")), None)
    return dict(facts, binary=binary, sha256=_digest(binary) if binary else None, name=_meta(kernel, "name"))


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_binary(facts: dict, device: int, grid_rank: int) -> Optional[Callable]:
    """go(grid, stream, args) for a binary the compile workers built (`binary_facts`), its function loaded
    from the file by torch's C launcher for `device`, without Triton's JIT: no source hashing, no cache
    lookup, no CompiledKernel. None where there is no C launcher or no file; ValueError where the file's
    checksum is not the one the worker recorded."""
    loader = getattr(getattr(torch._C, "_StaticCudaLauncher", None), "_load_kernel", None)
    if c_launcher() is None or loader is None or not facts.get("binary"):
        return None
    key = (facts["binary"], facts["name"], device)
    function = _loaded.get(key)
    if function is None:        # once per binary and device: a kernel launched from several wrapper lines
        # a file that is not the one the worker built (truncated, replaced) is never loaded
        if facts.get("sha256") is None or _digest(facts["binary"]) != facts["sha256"]:
            raise ValueError(f"{facts['binary']} is not the binary the compile worker built")
        function = _loaded[key] = loader(facts["binary"], facts["name"], facts["shared"], device)[0]
    return _generated(function, facts, grid_rank)


_loaded: dict = {}          # (binary file, function name, device) -> the loaded function handle


def _generated(function, facts: dict, grid_rank: int) -> Callable:
    params = [f"a[{i}]" for i in facts["keep"]] + ["None"] * facts["n_scratch"]
    grid = [f"grid[{d}]" if d < grid_rank else "1" for d in range(3)]
    scope = {"launch": c_launcher(), "function": function, "warps": facts["warps"], "shared": facts["shared"],
             "codes": facts["codes"]}
    exec(f"def go(grid, stream, a):\n"
         f"    launch(function, {', '.join(grid)}, warps, shared, codes, ({''.join(p + ', ' for p in params)}), stream)\n",
         scope)
    return scope["go"]
