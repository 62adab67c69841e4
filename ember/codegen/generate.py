"""What kernel generation hands back to the program builder, and the generation loop both kernel
backends share."""
from __future__ import annotations

import dataclasses

import sympy

from .wrapper.lines import CallKernel, DefineKernel, KernelSignature, Name


@dataclasses.dataclass
class GeneratedKernel:
    define: DefineKernel
    call: CallKernel
    stored: set           # buffer names the kernel writes to memory
    source: str
    # (buffer name, position) of each element whose position the call passes, in parameter order (they
    # follow the pointers in the call's arguments)
    elements: tuple = ()


def generate_kernel(make):
    """Generate with make(materialize) until every load of a kernel-local buffer was forwarded; a load
    that could not be keeps that buffer in memory on the next try."""
    materialize: set = set()
    while True:
        k = make(materialize).generate()
        missing = k.needs_store - materialize
        if not missing:
            return k
        materialize |= missing


def kernel_call_args(k) -> list:
    """The wrapper's arguments for a kernel: buffer pointers, element positions, xnumel, rnumel, then size
    symbols."""
    args = [Name(buf) for _, buf in k.args.call_order()] + [sympy.Integer(p) for _, p in k.args.elements]
    args += [k.X] + ([k.R] if k.has_rdim else [])
    return args + [sympy.Symbol(s) for s in k.args.sizes.values()]


def kernel_signature(k) -> KernelSignature:
    """The parameters that kernel_call_args fills, by name."""
    ints = list(k.args.elements.values()) + ["xnumel"] + (["rnumel"] if k.has_rdim else [])
    return KernelSignature(tuple(p for p, _ in k.args.call_order()), tuple(ints + list(k.args.sizes.values())))
