"""A combined kernel (schedule/combine.py) as Triton: one launch whose programs are split among its parts.

Each part is rendered as the pointwise kernel it would be on its own, as a @triton.jit function that is
handed its program's index (`pid`) instead of asking for it; parts with the same code share one function.
The combined kernel takes every buffer of its parts once and sends each program to its part:

    @triton.jit
    def kernel7_lerp_mul(in_ptr0, ..., out_ptr5):
        pid = tl.program_id(0)
        if pid < 3:
            kernel7_lerp_mul_part0(in_ptr0, in_ptr1, out_ptr0, 2816, pid, 1024)
        elif pid < 4:
            kernel7_lerp_mul_part1(in_ptr2, in_ptr1, out_ptr1, 512, pid - 3, 512)
        ...

Sizes are static (schedule.combine.combinable), so every part's block count is a literal; Triton inlines
the part functions. The launch's warps are the most any part asked for.
"""
from __future__ import annotations

from typing import Optional

import sympy

from ...ir.symbolic import is_static
from ...schedule.tiling import choose_tiling
from ..generate import GeneratedKernel, generate_kernel
from ..kernel import shared_pointers
from ..wrapper.lines import CallKernel, DefineKernel, KernelSignature, Name
from .kernel import TritonKernel


def generate_combined(backend, name: str, parts: list, graph) -> Optional[GeneratedKernel]:
    """[(group, its kernel-local buffers)] -> the combined kernel's GeneratedKernel; None where a part's
    kernel is not a flat pointwise kernel of static size whose arguments are pointers and element
    positions (a random op's seed, passed on as the combined kernel's parameter)."""
    kernels = []
    for group, local in parts:
        if choose_tiling(group, backend.tiling) is not None:
            return None
        k = generate_kernel(lambda materialize: TritonKernel(name, group, graph, local, materialize))
        if k.has_rdim or k.args.sizes or not is_static(k.X):
            return None
        k.pid_param = True
        kernels.append(k)
    combined = shared_pointers(kernels)
    pointer = {buf: param for param, buf in combined.call_order()}

    functions: dict[str, str] = {}       # a part's code (named "_") -> its function's name
    sources: list[str] = []
    body = ["pid = tl.program_id(0)"]
    first = 0
    warps = 1
    elements: dict[tuple, str] = {}      # (buffer, position) a part loads (a random op's seed) -> parameter
    for i, k in enumerate(kernels):
        meta = k.launch_config()
        warps = max(warps, meta["num_warps"])
        k.name = "_"
        code = k.source()
        if code not in functions:
            functions[code] = k.name = f"{name}_part{len(functions)}"
            sources.append(k.source())
        xblock = meta["XBLOCK"]
        blocks = -(-int(k.X) // xblock)
        args = [pointer[buf] for _, buf in k.args.call_order()]
        args += [elements.setdefault(e, f"elem{len(elements)}") for e in k.args.elements]
        args += [str(int(k.X)), "pid" if first == 0 else f"pid - {first}", str(xblock)]
        branch = "if" if i == 0 else "elif"
        body += [f"{branch} pid < {first + blocks}:", f"    {functions[code]}({', '.join(args)})"]
        first += blocks
    pointers = [p for p, _ in combined.call_order()]
    # positions are not specialized on, as in the parts' own kernels: one binary serves every layer's
    jit = f"@triton.jit(do_not_specialize={list(elements.values())!r})" if elements else "@triton.jit"
    signature = f"def {name}({', '.join(pointers + list(elements.values()))}):"
    sources.append("\n".join([jit, signature] + ["    " + ln for ln in body]))
    source = "\n\n".join(s.rstrip("\n") for s in sources) + "\n"

    call_args = [Name(buf) for _, buf in combined.call_order()] + [sympy.Integer(p) for _, p in elements]
    meta = {"num_warps": warps}
    define = DefineKernel(name, source, backend, None, backend._warm(graph, call_args, [meta]), parts[0][0].device(),
                          KernelSignature(tuple(pointers), tuple(elements.values())))
    call = CallKernel(name, call_args, [sympy.Integer(first)], meta)
    return GeneratedKernel(define, call, set(combined.outputs), source, tuple(elements))
