"""The C++/OpenMP kernel backend: fused groups -> C++ functions, with the same contract as the Triton
backend (see ember/codegen/backends.py).

A group's loop structure is chosen here: 2-D tiles for transposes (schedule/tiling.choose_tiling), rows for
broadcast or permuted reads (indexing.choose_rows), else one flat loop. A pointwise group of
independent nodes whose best structures differ (attention's q, k^T, v split out of one qkv buffer:
rows for q and v, tiles for k^T) runs as one loop nest per structure, inside one C function.
"""
from __future__ import annotations

import sympy

from ..backends import GeneratedKernel, generate_kernel, kernel_call_args
from ..kernel import ArgRegistry
from ..wrapper.lines import CallKernel, DefineKernel, Name
from ...schedule.tiling import choose_tiling
from .indexing import CPP_TILING, choose_rows
from .kernel import CppKernel
from .spelling import storage_type


def _plan(group) -> tuple:
    """(tiling, rows, awkward): the loop structure for a group and how many accesses stay gathers."""
    tiling = choose_tiling(group, CPP_TILING)
    rows, awkward = choose_rows(group)
    if tiling is not None and rows is not None and awkward == 0:
        tiling = None            # rows make every access contiguous or per-row: a broadcast, not a transpose
    return tiling, (rows if tiling is None else None), (0 if tiling is not None else awkward)


def _independent_parts(group, awkward: int) -> list:
    """Sub-groups of a pointwise group to generate as separate loop nests, or [] to keep it whole: only
    when no node reads what another writes, and splitting leaves fewer gathers."""
    from ...schedule.fusion import FusedGroup
    nodes = group.nodes
    if awkward == 0 or group.is_reduction() or len(nodes) < 2:
        return []
    for n in nodes:
        if any(n.reads & m.writes for m in nodes if m is not n):
            return []
    parts: dict = {}
    total = 0
    for n in nodes:
        tiling, rows, aw = _plan(FusedGroup([n]))
        total += aw
        parts.setdefault((tiling, rows), []).append(n)
    if len(parts) < 2 or total >= awkward:
        return []
    return [(FusedGroup(ns), tiling, rows) for (tiling, rows), ns in parts.items()]


class CppBackend:
    name = "cpp"

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        tiling, rows, awkward = _plan(group)
        parts = _independent_parts(group, awkward)
        if parts:
            return self._generate_parts(name, parts, graph, local)
        k = generate_kernel(lambda materialize: CppKernel(name, group, graph, local, materialize, tiling, rows))
        args = kernel_call_args(k)
        source = k.source()
        # the launcher ignores the grid: the kernel divides its rows between OpenMP threads itself
        call = CallKernel(name, args, [sympy.Integer(1)], {})
        return GeneratedKernel(DefineKernel(name, source, self.name), call, set(k.args.outputs), source)

    def _generate_parts(self, name, parts, graph, local) -> GeneratedKernel:
        """One C function calling one static function per part, each with its own loop structure."""
        kernels = []
        for i, (sub, tiling, rows) in enumerate(parts):
            kernels.append(generate_kernel(lambda materialize, sub=sub, tiling=tiling, rows=rows, i=i: CppKernel(
                f"{name}_part{i}", sub, graph, local, materialize, tiling, rows)))
        reg = ArgRegistry()
        for k in kernels:                  # parts are independent: a buffer one writes, no other reads
            for p, buf in k.args.call_order():
                reg.input(buf) if p.startswith("in_ptr") else reg.output(buf)
        ptr_of = {buf: p for p, buf in reg.call_order()}
        sizes = list(dict.fromkeys(s for k in kernels for s in k.args.sizes.values()))
        ints, call_ints, lines, calls = [], [], [], []
        for i, k in enumerate(kernels):
            own = [f"xnumel{i}"] + ([f"rnumel{i}"] if k.has_rdim else [])
            ints += own
            call_ints += [k.X] + ([k.R] if k.has_rdim else [])
            src = k.source().replace(f'extern "C" int {k.name}(', f"static int {k.name}(")
            lines += [ln for ln in src.splitlines() if not ln.startswith("// ember-args:")] + [""]
            args = [ptr_of[buf] for _, buf in k.args.call_order()] + own + list(k.args.sizes.values())
            calls.append(f"  ember_err |= {k.name}({', '.join(args + ['ember_threads'])});")
        params = [f"const {storage_type(graph.get_dtype(buf))}* {p}" if p.startswith("in_ptr") else
                  f"{storage_type(graph.get_dtype(buf))}* {p}" for p, buf in reg.call_order()]
        params += [f"int64_t {s}" for s in ints + sizes] + ["int ember_threads"]
        lines += [f"// ember-args: {len(ptr_of)} {len(ints) + len(sizes)}",
                  f'extern "C" int {name}({", ".join(params)}) {{', "  int ember_err = 0;"] + calls
        lines += ["  return ember_err;", "}"]
        source = "\n".join(lines) + "\n"
        call_args = [Name(buf) for _, buf in reg.call_order()] + call_ints + [sympy.Symbol(s) for s in sizes]
        call = CallKernel(name, call_args, [sympy.Integer(1)], {})
        stored = set().union(*(set(k.args.outputs) for k in kernels))
        return GeneratedKernel(DefineKernel(name, source, self.name), call, stored, source)
