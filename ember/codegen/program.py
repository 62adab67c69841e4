"""Scheduled groups -> a WrapperProgram: kernels generated per group, allocations before first write,
frees after last use, extern calls, views and the returned values."""
from __future__ import annotations


import dataclasses
import re
from typing import Optional

import sympy
import torch
from torch._library.fake_class_registry import FakeScriptObject

from .. import config, metrics
from ..ir.collectives import CollectiveKernel, WaitKernel, issuing_collective
from ..ir.kernel_call import KernelCall, is_kernel_call_result
from ..ir.nodes import (Buffer, ConstantBuffer, ExternKernel, InputBuffer, MultiOutput,
                        MutationBuffer, ReinterpretView)
from ..ir.symbolic import sympify
from ..schedule.memory import can_overwrite, kernel_local_buffers, last_uses
from .planned_peak import HeldForReuse, buffer_bytes, drop_reuses_that_raise_the_peak
from ..device import backend_for
from ..graph.passes.common import VIEW_OPS
from ..schedule.combine import CombinedGroup, combined_units, eligible
from ..schedule.structure import GroupStructure, group_structure
from .generate import GeneratedKernel
from .nan_checks import ValueOrigins
from .traffic import extern_bytes, kernel_bytes
from .wrapper.lines import (Allocate, Assert, CallExtern, CallKernel, Collective, DefineKernel, Free, MultiOutputLine, Name,
                            ProfiledCall, Return, Reuse, SymbolDef, View, WrapperProgram, device_call_label)


# a kernel's name lists the ATen ops it computes, up to this many (kernel3_mean_mul_rsqrt)
KERNEL_LABEL_OPS = 4
# values that only move or view others say nothing of what a kernel computes
LABEL_SKIPS = VIEW_OPS | {torch.ops.aten.clone.default, torch.ops.aten.copy.default, torch.ops.aten.copy_.default}


class ProgramBuilder:
    def __init__(self, lowering, groups, profile_prefix: Optional[str] = None):
        self.g = lowering
        self.groups = groups
        self.lines: list = []
        self.allocated: set[str] = set()
        self.kernel_count = 0
        # GeneratedKernel of each group, for debug output and tests; not the groups, which hold the whole IR
        self.kernels = []
        self.views = 0
        self.bound: set = set()      # size symbols the wrapper has bound so far
        self.layouts: dict = {}      # buffers this wrapper allocated -> layout key (reusable once dead)
        self.pool: dict = {}         # layout key -> [(dead buffer, the Free line that dropped it)]
        self.dying: set = set()      # buffers read for the last time by the kernel being generated
        self.handed_over: set = set()  # buffers whose memory an in-place output took (never pooled for reuse)
        self.reuses: list = []       # HeldForReuse: each dead buffer held for a later buffer of its layout
        self.defined: dict = {}      # structural key of a group -> (its GeneratedKernel, its GroupStructure)
        self.structures: dict = {}   # group id -> its GroupStructure (None: unkeyed)
        self.call_kernels: dict = {}  # a KernelCall launch's source (under a placeholder name) -> kernel name
        # config.check_nans: where each value comes from, for the checks after each call (None when off)
        self.value_origins = ValueOrigins(lowering)
        self.origins = self.value_origins if config.check_nans else None
        # config.report: each device call gets a ProfiledCall, its range named "<profile_prefix> #<n> <call>"
        self.profile_prefix = profile_prefix
        self.group_index = 0         # the group being generated
        self.profiled = 0

    def build(self) -> WrapperProgram:
        g = self.g
        self._bind_symbols()
        self.outputs = self._output_names()
        self.local = kernel_local_buffers(self.groups, self.outputs)
        self.last = last_uses(self.groups)
        self.last_in: dict = {}       # group index -> the buffers it uses last
        for s, j in self.last.items():
            self.last_in.setdefault(j, []).append(s)
        self.freeable = {b.get_name() for b in g.buffers if not isinstance(b, MutationBuffer)}
        self.freeable |= {n for n, b in g.graph_inputs.items()
                          if isinstance(b, InputBuffer) and not isinstance(b, ConstantBuffer)}
        for unit in self._units():
            if len(unit) > 1 and self._combined(unit):
                self._free(unit)
            else:
                for i in unit:
                    self._group(i)
        self.lines.append(Return([self._output_value(o) for o in g.outputs]))
        drop_reuses_that_raise_the_peak(self.lines, self.reuses, buffer_bytes(g))
        return WrapperProgram(list(g.graph_input_names), self.lines, dict(g.constants))

    def _group(self, i: int):
        group = self.groups[i]
        self.group_index = i
        if group.is_kernel():
            # buffers this wrapper allocated that die in this kernel: their memory may take its outputs
            self.dying = {s for s in group.reads if self.last.get(s) == i and s in self.layouts
                          and s not in self.outputs}
            self._kernel(group, self.local[group.id])
        else:
            for n in group.nodes:
                self._extern(n.buf)
        self._free([i])

    def _free(self, unit: list):
        """Free what the groups of `unit` (indices) use last; the memory of what this wrapper allocated
        is kept for a later buffer of its layout."""
        dead = sorted(s for i in unit for s in self.last_in.get(i, ()) if s in self.freeable and s not in self.outputs
                      and (s in self.allocated or s in self.g.graph_inputs))
        if dead:
            free = Free(dead)
            self.lines.append(free)
            for name in dead:
                if name in self.layouts and name not in self.handed_over:
                    self.pool.setdefault(self.layouts[name], []).append((name, free))

    def _units(self) -> list:
        """The groups' indices in order, as units: several indices are one combined kernel
        (schedule/combine.py), one index a group launched as before."""
        if not config.combine_kernels:
            return [[i] for i in range(len(self.groups))]

        def key(group):
            s = self._structure(group)
            return s.key if s is not None else None
        return combined_units(self.groups, eligible, key)

    def _structure(self, group) -> Optional[GroupStructure]:
        """The group's structural key (schedule/structure.py), computed once."""
        if group.id not in self.structures:
            self.structures[group.id] = group_structure(group, self.g, self.local[group.id],
                                                        backend_for(group.device()))
        return self.structures[group.id]

    def _combined(self, unit: list) -> bool:
        """The groups of `unit` as one combined kernel; False (nothing emitted) where the backend cannot
        render one of them as a part."""
        parts = [self.groups[i] for i in unit]
        combined = CombinedGroup(parts)
        backend = backend_for(combined.device())
        self.group_index = unit[0]
        name = f"kernel{self.kernel_count}{self._label(combined)}"
        structures = [self._structure(p) for p in parts]
        structure = None
        if all(s is not None for s in structures):
            buffers = tuple(b for s in structures for b in s.buffers)
            elements = tuple(e for s in structures for e in s.elements)
            # which parts' buffers (and element positions) are one is part of the structure: the kernel
            # takes each once
            order: dict = {}
            same = tuple(order.setdefault(b, len(order)) for b in buffers + elements)
            structure = GroupStructure(("combined", tuple(s.key for s in structures), same), buffers, elements)
        earlier = self.defined.get(structure.key) if structure is not None else None
        gen = _relaunch(*earlier, structure) if earlier is not None else None
        if gen is None:
            gen = backend.generate_combined(name, [(p, self.local[p.id]) for p in parts], self.g)
            if gen is None:
                return False
            if structure is not None:
                self.defined[structure.key] = (gen, structure)
            self.lines.append(gen.define)
        self.kernel_count += 1
        metrics.combined_kernels += 1
        metrics.combined_kernel_parts += len(parts)
        self.kernels.append(gen)
        for part in parts:
            # parts run at once: an output may take the memory of an input that dies here only if no
            # other part reads that input
            others = set().union(*(p.reads | p.writes for p in parts if p is not part))
            self.dying = {s for s in part.reads if self.last.get(s) in unit and s in self.layouts
                          and s not in self.outputs and s not in others}
            for n in part.nodes:
                if n.name in gen.stored or n.buf.storage_name() in gen.stored:
                    self._allocate(n.buf, part)
        self._emit_call(gen, combined)
        return True

    # -- pieces ----------------------------------------------------------------------------------------

    def _bind_symbols(self):
        bound = self.bound
        for name in self.g.graph_input_names:
            v = self.g.graph_inputs[name]
            if isinstance(v, sympy.Symbol) and v not in bound:
                self.lines.append(SymbolDef(str(v), name, "value"))
                bound.add(v)
            elif isinstance(v, InputBuffer):
                for what, vals in (("size", v.layout.size), ("stride", v.layout.stride)):
                    for d, s in enumerate(vals):
                        if isinstance(s, sympy.Symbol) and s not in bound:
                            self.lines.append(SymbolDef(str(s), name, what, d))
                            bound.add(s)

    def _bind_output_symbols(self, buf):
        """Sizes only known once an op ran (nonzero, masked_select ...): bind them from its output."""
        if buf.layout is None:
            return
        for d, s in enumerate(buf.layout.size):
            if isinstance(s, sympy.Symbol) and s not in self.bound:
                self.lines.append(SymbolDef(str(s), buf.get_name(), "size", d))
                self.bound.add(s)

    def _output_names(self) -> set:
        out = set()
        for o in self.g.outputs:
            if isinstance(o, ReinterpretView):
                out.add(o.data.storage_name())
            elif isinstance(o, Buffer):
                out.add(o.storage_name())
        return out

    def _allocate(self, buf: Buffer, group=None):
        name = buf.get_name()
        if name in self.allocated or isinstance(buf, (MutationBuffer, InputBuffer)):
            return
        self.allocated.add(name)
        key = _layout_key(buf.layout)
        in_place = next((old for old in sorted(self.dying) if self.layouts[old] == key
                         and can_overwrite(group, old, name)), None) if group is not None else None
        if in_place is not None:
            # computed in place: the kernel reads each element of `old` just before writing it to `name`
            self.dying.discard(in_place)
            self.handed_over.add(in_place)
            metrics.in_place_buffers += 1
            self.lines.append(Reuse(name, in_place, release_old=False))   # the kernel still reads `old`
        elif self.pool.get(key):
            # a dead buffer of the same layout: take its memory instead of allocating (kept only where
            # holding it until here leaves the program's peak as it is: planned_peak.drop_reuses_that_raise_the_peak)
            old, free = self.pool[key].pop()
            free.names.remove(old)
            l = buf.layout
            self.reuses.append(HeldForReuse(Reuse(name, old), free, Allocate(name, list(l.size), list(l.stride),
                                                                                   l.dtype, l.device)))
            self.lines.append(self.reuses[-1].reuse)
        else:
            metrics.buffers_allocated += 1
            l = buf.layout
            self.lines.append(Allocate(name, list(l.size), list(l.stride), l.dtype, l.device))
        self.layouts[name] = key

    def _kernel(self, group, local):
        backend = backend_for(group.device())
        name = f"kernel{self.kernel_count}{self._label(group)}"
        self.kernel_count += 1
        # a group whose kernel IR matches an earlier group's but for the buffers it touches (the same layer,
        # repeated) launches that group's kernel with its own buffers, instead of generating, compiling,
        # tuning and loading another copy
        structure = self._structure(group)
        earlier = self.defined.get(structure.key) if structure is not None else None
        gen = _relaunch(*earlier, structure) if earlier is not None else None
        if gen is None:
            gen = backend.generate(name, group, self.g, local)
            if structure is not None:
                self.defined[structure.key] = (gen, structure)
            self.lines.append(gen.define)
        self.kernels.append(gen)
        for n in group.nodes:
            if n.name in gen.stored or n.buf.storage_name() in gen.stored:
                self._allocate(n.buf, group)
        self._emit_call(gen, group)

    def _emit_call(self, gen: GeneratedKernel, group):
        call = gen.call
        if self.origins is not None:
            # a copy: a relaunched kernel's later calls share gen.call's definition, not what it writes
            call = dataclasses.replace(call, check=self.origins.kernel_check(call, group, gen.stored))
        if self.profile_prefix is not None:
            call = dataclasses.replace(call, profile=self._profiled(call, kernel_bytes(self.g, gen.define.signature,
                                                                                        call.args, group)))
        self.lines.append(call)

    def _arg(self, a):
        if isinstance(a, ReinterpretView):
            self.views += 1
            name = f"view{self.views}"
            l = a.layout
            self.lines.append(View(name, a.data.get_name(), list(l.size), list(l.stride), self._view_offset(a)))
            return Name(name)
        if isinstance(a, Buffer):
            return Name(a.get_name())
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(b) for b in a)
        if isinstance(a, dict):
            return {k: self._arg(v) for k, v in a.items()}
        if isinstance(a, torch.SymInt):
            return sympify(a)
        if isinstance(a, (FakeScriptObject, torch.Generator)):
            return self._opaque_input(a)
        return a

    def _opaque_input(self, fake) -> Name:
        """A graph input that is an opaque object (DTensor's traced graphs take some; a torch.Generator), by
        its input's name: the lowering holds the object traced, the wrapper must pass on the one it is called
        with."""
        name = next((n for n, v in self.g.graph_inputs.items() if v is fake), None)
        if name is None:
            raise NotImplementedError(f"an opaque object that is not a graph input: {fake!r}")
        return Name(name)

    def _extern(self, buf):
        if isinstance(buf, KernelCall):
            self._kernel_call(buf)
            return
        if is_kernel_call_result(buf):       # allocated and written by its KernelCall's launches
            return
        if isinstance(buf, MultiOutput):
            self.allocated.add(buf.get_name())
            self.lines.append(MultiOutputLine(buf.get_name(), buf.parent.get_name(), buf.path))
            self._bind_output_symbols(buf)
            self._check(buf)
            return
        assert isinstance(buf, ExternKernel)
        first_view = self.views + 1
        args = [self._arg(a) for a in buf.args]
        kwargs = {k: self._arg(v) for k, v in buf.kwargs.items()}
        if isinstance(buf, WaitKernel):
            # `x = wait_tensor(x)`: the waited tensor itself, complete (a view of one binds nothing)
            name = args[0] if isinstance(buf.waited, Buffer) else None
            issued_by = buf.issued_by.get_name() if buf.issued_by is not None else None
            call = CallExtern(name, buf.op, args, kwargs, collective=Collective("wait", issued_by=issued_by))
        else:
            self.allocated.add(buf.get_name())
            call = CallExtern(buf.get_name(), buf.op, args, kwargs)
            if isinstance(buf, CollectiveKernel):
                call.collective = Collective("issue", group=buf.group)
        # a collective's values are checked where they are read, after its wait
        if self.origins is not None and call.collective is None:
            call.check = self.origins.extern_check(call, buf)
        if self.profile_prefix is not None:
            # a wait moves no bytes: it returns once the collective has
            call.profile = self._profiled(call, (0, 0) if isinstance(buf, WaitKernel) else extern_bytes(self.g, buf))
        self.lines.append(call)
        # the views made for this call's arguments serve it alone: dropped now, they stop holding their
        # base's memory alive after the base itself is freed
        if self.views >= first_view:
            self.lines.append(Free([f"view{i}" for i in range(first_view, self.views + 1)]))
        self._bind_output_symbols(buf)
        self._check(buf)

    def _label(self, group) -> str:
        """`_op_op...`: the ATen ops whose values the kernel computes (up to KERNEL_LABEL_OPS of them), so
        that a profiler trace or a debug dump says what each kernel is."""
        ops = []
        for n in group.nodes:
            target = getattr(self.value_origins.fx_node(n.buf), "target", None)
            if target in LABEL_SKIPS:
                continue
            short = re.sub(r"\W", "", (getattr(target, "__name__", None) or "").split(".")[0]).strip("_")
            if short and short not in ops:
                ops.append(short)
        return "".join(f"_{op}" for op in ops[:KERNEL_LABEL_OPS])

    def _kernel_call(self, buf: KernelCall):
        """Allocate the results, then define and launch each kernel with the inputs and results."""
        for r in buf.results:
            self._allocate(r)
        backend = backend_for(buf.get_device())
        args = [self._arg(a) for a in buf.args] + [Name(r.get_name()) for r in buf.results]
        for launch in buf.launches:
            # the same call again (a decoder's layers): its kernel is defined, compiled and loaded once
            key = launch.source("KERNEL_NAME")
            name = self.call_kernels.get(key)
            if name is None:
                name = self.call_kernels[key] = f"kernel{self.kernel_count}"
                self.kernel_count += 1
                self.lines.append(DefineKernel(name, launch.source(name), backend, None, None, buf.get_device(),
                                               None))
            self.lines.append(CallKernel(name, list(args), list(launch.grid), dict(launch.meta)))

    def _profiled(self, call, moved: tuple) -> ProfiledCall:
        self.profiled += 1
        name = f"{self.profile_prefix} #{self.profiled} {device_call_label(call)}"
        return ProfiledCall(name, self.group_index, *moved)

    def _check(self, buf):
        """Kernels read extern outputs with the layout the op's meta function promised: check it, and
        where the output aliases nothing, copy a mismatched one into that layout."""
        if config.check_extern_layouts and buf.layout is not None:
            fresh = _aliases_nothing(buf) and buf.layout.offset == 0
            # a collective's output is being written until its wait: its layout is checked, never copied
            conform = fresh and issuing_collective(buf, ()) is None
            self.lines.append(Assert(buf.get_name(), list(buf.layout.size), list(buf.layout.stride), conform,
                                     buf.layout.dtype))
            if fresh:
                # memory of its own, in a known layout: reusable once dead, like an allocation
                self.layouts[buf.get_name()] = _layout_key(buf.layout)

    @staticmethod
    def _view_offset(view: ReinterpretView):
        """A view's offset past its base's storage offset (View's meaning). Both layouts hold offsets into
        the same storage as traced; at run time a graph input's own offset may differ: AOTAutograd's fake
        tangents can claim an offset the real ones lack (the grads of unbind's outputs arrive as separate
        tensors, the fakes say slices of one), and Dynamo does not guard a storage offset."""
        base = view.data.layout
        return view.layout.offset - (base.offset if base is not None else 0)

    def _output_value(self, o):
        if isinstance(o, (ReinterpretView, Buffer, FakeScriptObject)):
            return self._arg(o)
        return o


def _relaunch(gen: GeneratedKernel, structure: GroupStructure, mine: GroupStructure) -> Optional[GeneratedKernel]:
    """An earlier group's kernel, called with the buffers (and element positions) of a group of the same
    structure; None if the kernel has a position of the earlier group's as a literal where this group's
    differs (a template's epilogue)."""
    rename = dict(zip(structure.buffers, mine.buffers))
    element = dict(zip(structure.elements, mine.elements))
    passed = set(gen.elements)           # the rest are literals of the kernel's source
    if not passed <= element.keys() or any(old[1] != new[1] for old, new in element.items() if old not in passed):
        return None
    args = [Name(rename[a]) if isinstance(a, Name) else a for a in gen.call.args]
    first = len(gen.define.signature.pointers) if gen.elements else 0
    for i, e in enumerate(gen.elements):
        args[first + i] = sympy.Integer(element[e][1])
    call = CallKernel(gen.call.name, args, gen.call.grid, gen.call.meta)
    return GeneratedKernel(gen.define, call, {rename[s] for s in gen.stored}, gen.source, gen.elements)


def _aliases_nothing(buf) -> bool:
    """An extern output that is fresh memory per the op's schema (no `Tensor(a)` return, no mutation)."""
    kernel = buf.parent if isinstance(buf, MultiOutput) else buf
    schema = getattr(kernel.op, "_schema", None)
    return schema is not None and not kernel.mutated and all(r.alias_info is None for r in schema.returns)


def _layout_key(l) -> tuple:
    return (tuple(l.size), tuple(l.stride), l.offset, l.dtype, l.device)
