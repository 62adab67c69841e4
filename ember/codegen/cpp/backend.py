"""The C++/OpenMP kernel backend: fused groups -> C++ functions, compiled into one shared library per
graph (build.py). Its policies are attributes of CppBackend (see ember/device.py for what each means).

A group's loop structure is chosen here: 2-D tiles for transposes (schedule/tiling.choose_tiling), rows for
broadcast or permuted reads (indexing.choose_rows), else one flat loop. A pointwise group of
independent nodes whose best structures differ (attention's q, k^T, v split out of one qkv buffer:
rows for q and v, tiles for k^T) runs as one loop nest per structure, inside one C function.
"""
from __future__ import annotations

import sympy
import torch

from ...device import KernelBackend
from ..generate import GeneratedKernel, generate_kernel, kernel_call_args, kernel_signature
from ..kernel import shared_pointers
from ...schedule.fusion import FusedGroup
from ...schedule.tiling import choose_tiling
from ..wrapper.lines import CallKernel, DefineKernel, KernelSignature, Name
from .build import load_cpp_kernels
from .indexing import CPP_TILING, choose_rows
from .kernel import CppKernel
from .spelling import storage_type


def _plan(group) -> tuple:
    """(tiling, rows, awkward): the loop structure for a group and how many accesses stay gathers."""
    tiling = choose_tiling(group, CppBackend.tiling)
    rows, awkward = choose_rows(group)
    if tiling is not None and rows is not None and awkward == 0:
        tiling = None            # rows make every access contiguous or per-row: a broadcast, not a transpose
    return tiling, (rows if tiling is None else None), (0 if tiling is not None else awkward)


def _independent_parts(group, awkward: int) -> list:
    """Sub-groups of a pointwise group to generate as separate loop nests, or [] to keep it whole: only
    when no node reads what another writes, and splitting leaves fewer gathers."""
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


class CppBackend(KernelBackend):
    name = "cpp"
    device_type = "cpu"
    file_extension = "cpp"
    # softmax keeps exp(x - max) in a row buffer from the sum's pass for the division, and a row stays in
    # cache between its passes: an online sum would compute exp twice
    reads_rows_online = False
    # oneDNN runs NCHW convolutions slower than channels-last ones (`python -m benchmarks.conv_layout`)
    channels_last_convolutions = True
    tiling = CPP_TILING                      # transposes only
    # independent small kernels run as one C function (one call from the wrapper)
    combines_kernels = True

    def reduction_split_rows(self, strided: bool) -> tuple[int, int]:
        # an OpenMP thread per row (per 64 columns): only rows fewer than the threads are split. Strided
        # reductions never are: the partials' kernel would read each (chunk, column) row along the strided
        # dim, and the C++ column kernels tile only a contiguous x
        threads = torch.get_num_threads()
        return (0, 0) if strided else (threads - 1, 8 * threads)

    def load(self, kernels) -> dict:
        return load_cpp_kernels(kernels)

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        tiling, rows, awkward = _plan(group)
        parts = _independent_parts(group, awkward)
        if parts:
            return self._generate_parts(name, [(sub, tiling, rows, local) for sub, tiling, rows in parts], graph)
        k = generate_kernel(lambda materialize: CppKernel(name, group, graph, local, materialize, tiling, rows))
        args = kernel_call_args(k)
        source = k.source()
        # the launcher ignores the grid: the kernel divides its rows between OpenMP threads itself
        call = CallKernel(name, args, [sympy.Integer(1)], {})
        define = DefineKernel(name, source, self, signature=kernel_signature(k))
        return GeneratedKernel(define, call, set(k.args.outputs), source)

    def generate_combined(self, name, parts, graph) -> GeneratedKernel:
        """Independent groups (schedule/combine.py) as one C function calling each group's loop nest in
        turn: one call from the wrapper instead of one per group."""
        return self._generate_parts(name, [(group, *_plan(group)[:2], local) for group, local in parts], graph)

    def _generate_parts(self, name, parts, graph) -> GeneratedKernel:
        """One C function calling one static function per part (group, tiling, rows, its kernel-local
        buffers), each with its own loop structure."""
        kernels = []
        for i, (sub, tiling, rows, local) in enumerate(parts):
            kernels.append(generate_kernel(lambda materialize, sub=sub, tiling=tiling, rows=rows, i=i, local=local:
                                           CppKernel(f"{name}_part{i}", sub, graph, local, materialize, tiling, rows)))
        reg = shared_pointers(kernels)
        ptr_of = {buf: p for p, buf in reg.call_order()}
        sizes = list(dict.fromkeys(s for k in kernels for s in k.args.sizes.values()))
        ints, call_ints, lines, calls = [], [], [], []
        for i, k in enumerate(kernels):
            own = [f"xnumel{i}"] + ([f"rnumel{i}"] if k.has_rdim else [])
            ints += own
            call_ints += [k.X] + ([k.R] if k.has_rdim else [])
            lines += k.source(exported=False).splitlines() + [""]
            args = [ptr_of[buf] for _, buf in k.args.call_order()] + own + list(k.args.sizes.values())
            calls.append(f"  ember_err |= {k.name}({', '.join(args + ['ember_threads'])});")
        params = [f"const {storage_type(graph.get_dtype(buf))}* {p}" if p.startswith("in_ptr") else
                  f"{storage_type(graph.get_dtype(buf))}* {p}" for p, buf in reg.call_order()]
        params += [f"int64_t {s}" for s in ints + sizes] + ["int ember_threads"]
        lines += [f'extern "C" int {name}({", ".join(params)}) {{', "  int ember_err = 0;"] + calls
        lines += ["  return ember_err;", "}"]
        source = "\n".join(lines) + "\n"
        call_args = [Name(buf) for _, buf in reg.call_order()] + call_ints + [sympy.Symbol(s) for s in sizes]
        call = CallKernel(name, call_args, [sympy.Integer(1)], {})
        stored = set().union(*(set(k.args.outputs) for k in kernels))
        signature = KernelSignature(tuple(ptr_of.values()), tuple(ints + sizes))
        return GeneratedKernel(DefineKernel(name, source, self, signature=signature), call, stored, source)
