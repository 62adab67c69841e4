"""The C++/OpenMP kernel backend: fused groups -> C++ functions, with the same contract as the Triton
backend (see ember/codegen/backends.py)."""
from __future__ import annotations

import sympy

from ..backends import GeneratedKernel, generate_kernel, kernel_call_args
from ..wrapper.lines import CallKernel, DefineKernel
from .kernel import CppKernel


class CppBackend:
    name = "cpp"

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        from ...schedule.tiling import choose_tiling
        tiling = choose_tiling(group)
        if tiling is not None and any(not n.split(tiling)[1] for n in group.nodes):
            tiling = None            # a node without the inner axis would be recomputed per element
        k = generate_kernel(lambda materialize: CppKernel(name, group, graph, local, materialize, tiling))
        args = kernel_call_args(k)
        source = k.source()
        # the launcher ignores the grid: the kernel divides its rows between OpenMP threads itself
        call = CallKernel(name, args, [sympy.Integer(1)], {})
        return GeneratedKernel(DefineKernel(name, source, self.name), call, set(k.args.outputs), source)
