"""Wrapper IR -> torch.fx.GraphModule, for out-of-tree backends.

The GraphModule's forward takes the same inputs as the Python wrapper's `call(args)` (one placeholder
per input) and returns the same tuple. Each line type becomes graph nodes:

    SymbolDef        call_method size / stride / storage_offset on an input (or the scalar input itself)
    Allocate         torch.empty_strided
    Free             nothing: FX's generated code drops each value after its last use
    Reuse            the new name aliases the old buffer's node
    DefineKernel     get_attr of the loaded kernel (source in node.meta["ember_kernel_source"])
    CallKernel       launch_kernel(kernel, grid, *args, **meta), sizes computed in the graph (grid None:
                     a kernel whose config follows the sizes, launched as kernel.run(*args))
    CallExtern       call_function of the op; a collective's issue or wait carries its Collective in
                     node.meta["ember_collective"], and a wait's node is the waited value from then on
    MultiOutputLine  operator.getitem
    View             torch.as_strided at the base's storage_offset() plus the view's offset
    Assert           check_layout(tensor, size, stride, name), or name = conform_layout(...) with conform

    Return           the output node

After each device call, debug_sync(label) with config.debug_sync, and with config.check_nans
check_finite(what, values, origins, reads) on the values the call wrote (the line's FiniteCheck). With
config.report, open_range(name) before the call and close_range(range) after it (the line's ProfiledCall).

Kernels write their outputs in place and return None, so nothing uses a launch node's value:
`launch_kernel` and `check_layout` are registered as side-effecting, which keeps them through
`eliminate_dead_code`, in their order.

A backend subclasses FxWrapper and overrides `compile_graph(gm)` to transform the graph and return
any callable; `ember.config.fx_wrapper_class` selects the subclass (see docs/fx_backend_example.py).
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import sympy
import torch
import torch.fx
from torch.fx.node import has_side_effect

from ... import config
from ..kernel import print_index
from ...runtime import checks, ranges
from .lines import (Allocate, Assert, CallExtern, CallKernel, DefineKernel, Free, MultiOutputLine, Name, Return,
                    Reuse, SymbolDef, View, WrapperProgram, device_call_label)


debug_sync = has_side_effect(checks.debug_sync)
check_finite = has_side_effect(checks.check_finite)
open_range = has_side_effect(ranges.open_range)
close_range = has_side_effect(ranges.close_range)


@has_side_effect
def launch_kernel(kernel, grid, *args, **meta) -> None:
    if grid is None:
        kernel.run(*args)        # the config (and grid) follows the sizes: autotuned, or RBLOCK per row length
    else:
        kernel[tuple(grid)](*args, **meta)


@has_side_effect
def check_layout(t: torch.Tensor, size, stride, name: str, dtype=None) -> None:
    checks.check_layout(t, size, stride, name, dtype)


def eval_index(code: str, **symbols) -> int:
    """Index arithmetic the node-by-node rendering does not cover, evaluated as the Python wrapper
    would evaluate the same printed expression."""
    return eval(code, {"min": min, "max": max}, symbols)


def _is_negative(term) -> bool:
    coeff = term.as_coeff_Mul()[0]
    return bool(coeff.is_Number and coeff < 0)


# Values FX's code generator can spell; anything else becomes an attribute of the module.
_LITERALS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format,
             torch._ops.OpOverload)


class FxRenderer:
    """One WrapperProgram -> one GraphModule."""

    def __init__(self, program: WrapperProgram, kernels: dict):
        self.program = program
        self.kernels = kernels                   # kernel name -> launchable
        self.graph = torch.fx.Graph()
        self.env: dict[str, Any] = {}            # wrapper name -> fx node (or a Python value)
        self.attrs: dict[str, Any] = {}          # module attributes: constants, kernels, odd objects
        self._exprs: dict[sympy.Expr, Any] = {}
        self._ids: dict[int, str] = {}

    def render(self) -> torch.fx.GraphModule:
        for name in self.program.inputs:
            self.env[name] = self.graph.placeholder(name)
        sync = config.debug_sync
        for ln in self.program.lines:
            handler = RENDERERS.get(type(ln))
            if handler is None:
                raise TypeError(f"no FX rendering for {type(ln).__name__}")
            profile = getattr(ln, "profile", None)    # config.report
            opened = self.graph.call_function(open_range, (profile.range,)) if profile is not None else None
            handler(self, ln)
            if opened is not None:
                self.graph.call_function(close_range, (opened,))
            label = device_call_label(ln) if sync else None
            if label is not None:
                self.graph.call_function(debug_sync, (label,))
            check = getattr(ln, "check", None)         # config.check_nans
            if check is not None:
                values = [self.lookup(n) for n in check.names]
                reads = {n: self.lookup(n) for n in check.reads}
                self.graph.call_function(check_finite, (check.what, values, list(check.origins), reads))
        self.graph.lint()
        gm = torch.fx.GraphModule(self.attrs, self.graph, class_name="EmberWrapper")
        return gm

    # -- values -----------------------------------------------------------------------------------------

    def lookup(self, name: str):
        if name in self.env:
            return self.env[name]
        if name in self.program.constants:
            self.env[name] = self.attr(self.program.constants[name], name)
            return self.env[name]
        raise KeyError(f"ember FX wrapper: {name!r} is used but not bound (freed too early?)")

    def attr(self, obj, hint: str) -> torch.fx.Node:
        key = id(obj)
        if key not in self._ids:
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "c"
            base = base if not base[0].isdigit() else "_" + base
            name, i = base, 0
            while name in self.attrs or hasattr(torch.fx.GraphModule, name):
                i += 1
                name = f"{base}_{i}"
            self._ids[key] = name
            self.attrs[name] = obj
        return self.graph.get_attr(self._ids[key])

    def value(self, v):
        if isinstance(v, Name):
            return self.lookup(str(v))
        if isinstance(v, sympy.Basic):
            return self.expr(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, slice):
            return slice(self.value(v.start), self.value(v.stop), self.value(v.step))
        if isinstance(v, _LITERALS):
            return v
        return self.attr(v, f"c_{type(v).__name__}")

    def expr(self, e: sympy.Expr):
        """A sympy size or index expression -> graph arithmetic on the bound symbols (or a plain int)."""
        e = sympy.sympify(e)
        if e.is_Integer:
            return int(e)
        if e in self._exprs:
            return self._exprs[e]
        call = self.graph.call_function
        # by class name, as the index printer does: sizes from the ShapeEnv use torch's own FloorDiv,
        # ModularIndexing, Max ... which are not ember's classes
        kinds = {c.__name__ for c in type(e).__mro__}
        if isinstance(e, sympy.Symbol):
            out = self.lookup(str(e))
        elif isinstance(e, sympy.Add):
            terms = sorted(e.args, key=lambda t: (t.is_Number, _is_negative(t)))   # s0 - 1, not -1 + s0
            out = self.expr(terms[0])
            for t in terms[1:]:
                out = (call(operator.sub, (out, self.expr(-t))) if _is_negative(t)
                       else call(operator.add, (out, self.expr(t))))
        elif isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if not coeff.is_Integer:
                return self._eval(e)
            factors = rest.args if isinstance(rest, sympy.Mul) else (rest,)
            out = self.expr(factors[0])
            for f in factors[1:]:
                out = call(operator.mul, (out, self.expr(f)))
            if coeff == -1:
                out = call(operator.neg, (out,))
            elif coeff != 1:
                out = call(operator.mul, (int(coeff), out))
        elif "FloorDiv" in kinds:
            out = call(operator.floordiv, (self.expr(e.args[0]), self.expr(e.args[1])))
        elif "ModularIndexing" in kinds:
            base, div, mod = (self.expr(a) for a in e.args)
            if div != 1:
                base = call(operator.floordiv, (base, div))
            out = call(operator.mod, (base, mod))
        elif kinds & {"Min", "Max"}:
            fn = torch.sym_min if "Min" in kinds else torch.sym_max
            args = [self.expr(a) for a in e.args]
            out = args[0]
            for a in args[1:]:
                out = call(fn, (out, a))
        elif isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base = self.expr(e.base)
            out = base
            for _ in range(int(e.exp) - 1):
                out = call(operator.mul, (out, base))
        else:
            return self._eval(e)
        self._exprs[e] = out
        return out

    def _eval(self, e: sympy.Expr):
        syms = {str(s): self.lookup(str(s)) for s in sorted(e.free_symbols, key=str)}
        out = self.graph.call_function(eval_index, (print_index(e),), syms)
        self._exprs[e] = out
        return out

    # -- lines ------------------------------------------------------------------------------------------

    def symbol_def(self, ln: SymbolDef):
        src = self.lookup(ln.source)
        if ln.what == "value":
            self.env[ln.name] = src
            return
        if ln.what == "offset":
            self.env[ln.name] = self.graph.create_node("call_method", "storage_offset", (src,), name=ln.name)
        else:
            self.env[ln.name] = self.graph.create_node("call_method", ln.what, (src, ln.dim), name=ln.name)

    def allocate(self, ln: Allocate):
        self._call(ln.name, torch.empty_strided, (self.value(tuple(ln.size)), self.value(tuple(ln.stride))),
                   {"dtype": ln.dtype, "device": ln.device})

    def free(self, ln: Free):
        # FX's generated forward sets each value to None after its last use, which is where the Python
        # wrapper's `del` goes or later; unbinding here makes a use after Free fail while rendering.
        for n in ln.names:
            self.env.pop(n, None)

    def reuse(self, ln: Reuse):
        self.env[ln.name] = self.lookup(ln.old)
        if ln.release_old:
            del self.env[ln.old]

    def define_kernel(self, ln: DefineKernel):
        node = self.attr(self.kernels[ln.name], ln.name)
        node.meta["ember_kernel_source"] = ln.source
        node.meta["ember_kernel_backend"] = ln.backend.name
        self.env[f"<kernel {ln.name}>"] = node

    def call_kernel(self, ln: CallKernel):
        kernel = self.env.get(f"<kernel {ln.name}>")
        if kernel is None:
            kernel = self.attr(self.kernels[ln.name], ln.name)
        grid = None if ln.grid is None else self.value(tuple(ln.grid))
        args = (kernel, grid) + tuple(self.value(a) for a in ln.args)
        node = self.graph.create_node("call_function", launch_kernel, args,
                                      {k: self.value(v) for k, v in ln.meta.items()}, name=f"{ln.name}_launch")
        node.meta["ember_kernel"] = ln.name

    def call_extern(self, ln: CallExtern):
        op = ln.op
        if not callable(op):
            raise TypeError(f"ember FX wrapper: extern op {op!r} is not callable")
        node = self._call(ln.name, op, self.value(tuple(ln.args)), {k: self.value(v) for k, v in ln.kwargs.items()})
        if ln.collective is not None:
            node.meta["ember_collective"] = ln.collective

    def multi_output(self, ln: MultiOutputLine):
        node = self.lookup(ln.parent)
        for i in ln.path[:-1]:
            node = self.graph.call_function(operator.getitem, (node, i))
        self._call(ln.name, operator.getitem, (node, ln.path[-1]))

    def view(self, ln: View):
        base = self.lookup(ln.base)
        offset = self.graph.call_function(operator.add, (self.graph.call_method("storage_offset", (base,)),
                                                         self.value(ln.offset)))
        self._call(ln.name, torch.as_strided, (base, self.value(tuple(ln.size)), self.value(tuple(ln.stride)),
                                               offset))

    def assert_(self, ln: Assert):
        args = (self.lookup(ln.name), self.value(tuple(ln.size)), self.value(tuple(ln.stride)), ln.name, ln.dtype)
        if ln.conform:
            self._call(ln.name, checks.conform_layout, args)
        else:
            self.graph.call_function(check_layout, args)

    def return_(self, ln: Return):
        self.graph.output(tuple(self.value(v) for v in ln.values))

    def _call(self, name, target, args, kwargs=None):
        # the wrapper's names (buf3, view1) make the graph read like the Python wrapper
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        if name:
            self.env[name] = node
        return node


RENDERERS: dict[type, Callable] = {
    SymbolDef: FxRenderer.symbol_def, Allocate: FxRenderer.allocate, Free: FxRenderer.free,
    Reuse: FxRenderer.reuse, DefineKernel: FxRenderer.define_kernel, CallKernel: FxRenderer.call_kernel,
    CallExtern: FxRenderer.call_extern, MultiOutputLine: FxRenderer.multi_output, View: FxRenderer.view,
    Assert: FxRenderer.assert_, Return: FxRenderer.return_,
}


class BoxedCall:
    """The boxed calling convention compile_graph's callers use: `fn(list_of_inputs) -> tuple`, the list
    emptied. Unlike the Python wrapper, which drops an input at its Free line, the positional call keeps
    every input alive until the graph returns (`forward` takes one argument per input, as backends expect)."""
    _boxed_call = True

    def __init__(self, fn: Callable, gm: torch.fx.GraphModule):
        self.fn, self.gm = fn, gm

    def __call__(self, args):
        a = list(args)
        args.clear()
        out = self.fn(*a)
        return out if isinstance(out, tuple) else tuple(out)


class FxWrapper:
    """Renders Wrapper IR as a GraphModule and hands it to `compile_graph`. Subclass and override
    `compile_graph(gm)` to transform or run the graph your way; return any callable that takes the
    graph's inputs as positional arguments and returns its outputs."""

    def render(self, program: WrapperProgram) -> torch.fx.GraphModule:
        return FxRenderer(program, program.load_kernels()).render()

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return gm

    def compile(self, program: WrapperProgram) -> BoxedCall:
        gm = self.render(program)
        return BoxedCall(self.compile_graph(gm), gm)


def compile_fx(program: WrapperProgram, wrapper_class=None):
    """-> (boxed callable, the rendered graph's Python code): compile_python's counterpart."""
    cls = wrapper_class or config.fx_wrapper_class or FxWrapper
    fn = cls().compile(program)
    return fn, fn.gm.code
