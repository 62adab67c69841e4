"""The C++/OpenMP kernel backend: fused groups -> C++ functions, with the same contract as the Triton
backend (see ember/codegen/backends.py)."""
from __future__ import annotations

import sympy

from ..backends import GeneratedKernel
from ..wrapper.lines import CallKernel, DefineKernel, Name
from .kernel import CppKernel


class CppBackend:
    name = "cpp"

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        from ...schedule.tiling import choose_tiling
        tiling = choose_tiling(group)
        if tiling is not None and any(not n.split(tiling)[1] for n in group.nodes):
            tiling = None            # a node without the inner axis would be recomputed per element
        materialize: set = set()
        while True:
            k = CppKernel(name, group, graph, local, materialize, tiling).generate()
            missing = k.needs_store - materialize
            if not missing:
                break
            materialize |= missing   # a load could not be forwarded: keep that buffer in memory
        args = [Name(buf) for _, buf in k.args.call_order()] + [k.X] + ([k.R] if k.has_rdim else [])
        args += [sympy.Symbol(s) for s in k.args.sizes.values()]
        source = k.source()
        # the launcher ignores the grid: the kernel divides its rows between OpenMP threads itself
        call = CallKernel(name, args, [sympy.Integer(1)], {})
        return GeneratedKernel(DefineKernel(name, source, self.name), call, set(k.args.outputs), source)
