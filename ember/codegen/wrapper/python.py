"""Wrapper IR -> Python source of `def call(args)`, loaded with its kernels and constants as globals."""
from __future__ import annotations

import functools
from typing import Any

import sympy
import torch

from ... import config
from ...runtime.checks import check_finite, check_layout, conform_layout, debug_sync
from ...runtime.launch import call_site
from ...runtime.loader import load_module
from ...runtime.ranges import profile_range
from ...runtime.tensors import fast_empty_strided, reinterpret
from .device_guard import guarded_device_index
from ..kernel import print_index
from .lines import (Allocate, Assert, CallExtern, CallKernel, DefineKernel, Free, MultiOutputLine, Name, Return,
                    Reuse, SymbolDef, View, WrapperProgram, device_call_label)


class PythonWrapper:
    def __init__(self, program: WrapperProgram):
        self.program = program
        self.globals: dict[str, Any] = {"torch": torch, "empty_strided": torch.empty_strided,
                                        "as_strided": reinterpret, "check_layout": check_layout,
                                        "conform_layout": conform_layout, "debug_sync": debug_sync,
                                        "check_finite": check_finite, "profile_range": profile_range}
        self._ids: dict[int, str] = {}
        self.sites: dict[str, tuple] = {}       # global name of a kernel's call site -> (kernel name, meta)
        # buffers on the device the program runs with as current, and on the CPU, are allocated by torch's
        # C allocator entry (runtime/tensors.py): no device argument to parse
        self._fast_alloc = {"cpu"}
        index = guarded_device_index(program)
        if index is not None:
            self._fast_alloc.add(f"cuda:{index}")

    def const(self, obj, hint: str) -> str:
        """A global name for an object the source cannot spell."""
        key = id(obj)
        if key not in self._ids:
            name = "".join(c if c.isalnum() else "_" for c in hint)
            while name in self.globals:
                name += "_"
            self._ids[key] = name
            self.globals[name] = obj
        return self._ids[key]

    def value(self, v) -> str:
        if isinstance(v, Name):
            return str(v)
        if isinstance(v, sympy.Basic):
            return print_index(v)
        if isinstance(v, (list, tuple)):
            inner = ", ".join(self.value(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
        if isinstance(v, dict) and all(isinstance(k, (str, int)) for k in v):
            return "{" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, torch.dtype):
            return str(v)
        if isinstance(v, torch.device):      # a global: building a device object costs every call
            return self.const(v, f"device_{v.type}{'' if v.index is None else v.index}")
        if isinstance(v, (bool, int, str)) or v is None:
            return repr(v)
        if isinstance(v, float):
            return repr(v) if v == v and abs(v) != float("inf") else f"float({str(v)!r})"
        if isinstance(v, torch.layout):
            return str(v)
        if isinstance(v, torch.memory_format):
            return str(v)
        return self.const(v, f"c_{type(v).__name__}")

    def render(self) -> str:
        p = self.program
        out = ["def call(args):"]
        body = []
        if p.inputs:
            body.append(f"{', '.join(p.inputs)}{',' if len(p.inputs) == 1 else ''} = args")
        body.append("args.clear()")
        sync = config.debug_sync
        for line in p.lines:
            profile = getattr(line, "profile", None)      # config.report
            if profile is None:
                body.extend(self.line(line))
            else:
                body.append(f"with profile_range({profile.range!r}):")
                body.extend("    " + ln for ln in self.line(line))
            label = device_call_label(line) if sync else None
            if label is not None:
                body.append(f"debug_sync({label!r})")
            check = getattr(line, "check", None)       # config.check_nans
            if check is not None:
                reads = ", ".join(f"{n!r}: {n}" for n in check.reads)
                body.append(f"check_finite({check.what!r}, [{', '.join(check.names)}], {list(check.origins)!r}, "
                            f"{{{reads}}})")
        out += ["    " + ln for ln in body]
        return "\n".join(out) + "\n"

    def line(self, ln) -> list[str]:
        v = self.value
        if isinstance(ln, SymbolDef):
            if ln.what == "value":
                return [f"{ln.name} = {ln.source}"]
            call = {"size": f"size({ln.dim})", "stride": f"stride({ln.dim})", "offset": "storage_offset()"}[ln.what]
            return [f"{ln.name} = {ln.source}.{call}"]
        if isinstance(ln, Allocate):
            fast = fast_empty_strided(ln.device.type) if str(ln.device) in self._fast_alloc else None
            if fast is not None:
                alloc = self.const(fast, f"empty_strided_{ln.device.type}")
                return [f"{ln.name} = {alloc}({v(tuple(ln.size))}, {v(tuple(ln.stride))}, {v(ln.dtype)})"]
            return [f"{ln.name} = empty_strided({v(tuple(ln.size))}, {v(tuple(ln.stride))}, "
                    f"dtype={v(ln.dtype)}, device={v(ln.device)})"]
        if isinstance(ln, Free):
            return [f"del {', '.join(ln.names)}"] if ln.names else []
        if isinstance(ln, Reuse):
            return [f"{ln.name} = {ln.old}; del {ln.old}" if ln.release_old else f"{ln.name} = {ln.old}"]
        if isinstance(ln, DefineKernel):
            return []
        if isinstance(ln, CallKernel):
            args = ", ".join(v(a) for a in ln.args)
            if ln.grid is None:
                return [f"{ln.name}.run({args})"]
            # each line calls a site of its own, bound when the kernels are loaded (runtime/launch.py)
            site = f"{ln.name}_site{len(self.sites)}"
            self.sites[site] = (ln.name, dict(ln.meta))
            meta = ", ".join(f"{k}={v(x)}" for k, x in ln.meta.items())
            return [f"{site}({v(tuple(ln.grid))}, {args})" + (f"  # {meta}" if meta else "")]
        if isinstance(ln, CallExtern):
            target = c_entry(ln.op) if isinstance(ln.op, torch._ops.OpOverload) else ln.op
            op = self.const(target, f"aten_{ln.op.__name__}" if hasattr(ln.op, "__name__") else "op")
            args = [v(a) for a in ln.args] + [f"{k}={v(x)}" for k, x in ln.kwargs.items()]
            call = f"{op}({', '.join(args)})"
            return [f"{ln.name} = {call}" if ln.name else call]
        if isinstance(ln, MultiOutputLine):
            return [f"{ln.name} = {ln.parent}" + "".join(f"[{i!r}]" for i in ln.path)]
        if isinstance(ln, View):
            return [f"{ln.name} = as_strided({ln.base}, {v(tuple(ln.size))}, {v(tuple(ln.stride))}, {v(ln.offset)})"]
        if isinstance(ln, Assert):
            args = f"{ln.name}, {v(tuple(ln.size))}, {v(tuple(ln.stride))}, {ln.name!r}"
            if ln.dtype is not None:
                args += f", {v(ln.dtype)}"
            return [f"{ln.name} = conform_layout({args})" if ln.conform else f"check_layout({args})"]
        if isinstance(ln, Return):
            vals = ", ".join(v(x) for x in ln.values)
            return [f"return ({vals}{',' if len(ln.values) == 1 else ''})"]
        raise TypeError(f"no Python rendering for {type(ln).__name__}")


def c_entry(op: torch._ops.OpOverload):
    """The C function a wrapper calls for `op`. An OpOverload's __call__ is one Python frame around its boxed
    C entry (`op._op`), which converts every argument by the schema: a convolution costs more than twice as
    much that way as through torch's own binding (`torch.convolution`, the argument parser's C++ path;
    `python -m experiments.extern_call_probe`). The binding is taken where the op has no overload it could
    resolve to instead of `op` (its only others are `out=` variants)."""
    binding = getattr(torch._C._VariableFunctions, op._opname, None) if op.namespace == "aten" else None
    if op._overloadname == "default" and binding is not None and \
            all(o == "default" or o == "out" or o.endswith("_out") for o in op.overloadpacket.overloads()):
        return binding
    return op._op


def compile_python(program: WrapperProgram):
    """-> (callable taking a list of args, its source)."""
    w = PythonWrapper(program)
    source = w.render()
    kernels = program.load_kernels()
    w.globals.update(kernels)
    w.globals.update(program.constants)
    mod = load_module(source, "ember_wrapper", w.globals)
    scope = mod.__dict__          # where `call` looks its globals up
    for site, (kernel, meta) in w.sites.items():
        scope[site] = call_site(kernels[kernel], meta, functools.partial(scope.__setitem__, site))
    return mod.call, source
