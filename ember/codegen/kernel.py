"""What every kernel backend shares: the value type its handler returns, common-subexpression
elimination, kernel arguments, printing sympy index expressions as code, and how a spelled op becomes a
value (its dtype and cost from the op table, ember/ir/op_table.py)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import sympy
import torch
from sympy.printing.str import StrPrinter

from ..ir.op_table import MATH_OPS, one_element_reduction
from ..ir.ops import handler
from ..ir.symbolic import FloorDiv, ModularIndexing
from ..schedule.nodes import kernel_index_vars


@dataclasses.dataclass(frozen=True)
class KValue:
    """A value in generated code. `kind` is its shape class: "const" (a literal), "scalar" (one value
    per kernel), "x" (one per output element / row), "xr" (one per row element of a reduction)."""
    name: str
    dtype: torch.dtype
    kind: str

    def __str__(self):
        return self.name


_KIND_ORDER = {"const": 0, "scalar": 1, "x": 2, "xr": 3}


def widest_kind(*values) -> str:
    kinds = [v.kind for v in values if isinstance(v, KValue)]
    return max(kinds, key=_KIND_ORDER.__getitem__) if kinds else "const"


def op_dtype(name: str, *vals: KValue) -> torch.dtype:
    """The op table's result dtype of IR op `name` over kernel values (a literal acts like a Python scalar)."""
    return MATH_OPS[name].result_dtype([v.dtype for v in vals], [v.kind == "const" for v in vals])


class OpSpelling:
    """Base of the backends' spelling mixins: `_op(name, expr, *operands)` turns the spelling `expr` of IR op
    `name` into a value whose dtype and cost the op table decides. The kernel provides
    `_value(expr, dtype, kind, operands, costly)`, which names it."""

    def _op(self, name: str, expr: str, *vals: KValue, dtype=None) -> KValue:
        """`dtype` overrides the table's, for ops outside it (rand ...) and spellings that already computed it."""
        if dtype is None:
            dtype = op_dtype(name, *vals)
        op = MATH_OPS.get(name)
        kind = widest_kind(*vals)
        return self._value(expr, dtype, "scalar" if kind == "const" else kind, vals,
                           op is not None and op.is_costly(dtype))

    # logical ops compare with zero in every language; a backend names its operators for and, or, xor
    logical_symbols: dict = {}

    def isnan(self, x):
        return self._op("isnan", f"({x} != {x})", x)

    def logical_not(self, x):
        return self._op("logical_not", f"({x} == 0)", x)

    def _logical(self, name, a, b):
        return self._op(name, f"(({a} != 0) {self.logical_symbols[name]} ({b} != 0))", a, b)

    def logical_and(self, a, b):
        return self._logical("logical_and", a, b)

    def logical_or(self, a, b):
        return self._logical("logical_or", a, b)

    def logical_xor(self, a, b):
        return self._logical("logical_xor", a, b)


class IndexPrinter(StrPrinter):
    """Prints index arithmetic with integer semantics; all operands are non-negative."""
    floordiv = "//"       # the language's floor division of non-negative integers

    def _print_FloorDiv(self, expr):
        a, b = expr.args
        return f"({self._paren(a)} {self.floordiv} {self._paren(b)})"

    def _print_ModularIndexing(self, expr):
        a, d, m = expr.args
        inner = self._paren(a) if d == 1 else f"({self._paren(a)} {self.floordiv} {self._paren(d)})"
        return f"({inner} % {self._paren(m)})"

    def _print_CeilToInt(self, expr):
        # torch's shape functions: ceil(a / b) of non-negative integers, as (a + b - 1) // b
        a, b = self._ratio(expr.args[0])
        return f"(({self._paren(a)} + {self._paren(b - 1)}) {self.floordiv} {self._paren(b)})"

    def _print_FloorToInt(self, expr):
        a, b = self._ratio(expr.args[0])
        return f"({self._paren(a)} {self.floordiv} {self._paren(b)})"

    @staticmethod
    def _ratio(e):
        if type(e).__name__ in ("IntTrueDiv", "FloatTrueDiv"):
            return e.args
        num, den = sympy.fraction(sympy.together(e))
        if not (num.is_integer and den.is_integer):
            raise ValueError(f"cannot print {e} as index arithmetic")
        return num, den

    def _print_Min(self, expr):
        return self._minmax("min", expr.args)

    def _print_Max(self, expr):
        return self._minmax("max", expr.args)

    def _minmax(self, fn, args):
        out = self._print(args[0])
        for a in args[1:]:
            out = f"{fn}({out}, {self._print(a)})"
        return out

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + " * ".join([self._paren(base)] * int(exp)) + ")"
        raise ValueError(f"cannot print {expr} as index arithmetic")

    def _print_Rational(self, expr):
        raise ValueError(f"index {expr} is not an integer")

    def _paren(self, e):
        s = self._print(e)
        return s if (e.is_Atom or isinstance(e, (FloorDiv, ModularIndexing))) else f"({s})"


_printer = IndexPrinter()


@functools.lru_cache(maxsize=65536, typed=True)
def print_index(expr) -> str:
    # remembered: kernels of repeated layers print the same indices, and sympy's printer sorts every sum
    return _printer.doprint(sympy.sympify(expr))


class ArgRegistry:
    """Kernel arguments: pointers for buffers (in_ptr / out_ptr / in_out_ptr), positions of elements read as
    arguments (`element`), then size symbols."""

    def __init__(self):
        self.inputs: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.elements: dict[tuple, str] = {}       # (buffer name, position) -> parameter
        self.sizes: dict[sympy.Symbol, str] = {}
        self.added_into: set[str] = set()          # outputs stored by atomic adds (accumulate)
        self._count = {"in_ptr": 0, "out_ptr": 0, "in_out_ptr": 0}

    def _new(self, kind: str) -> str:
        self._count[kind] += 1
        return f"{kind}{self._count[kind] - 1}"

    def input(self, name: str) -> str:
        if name in self.outputs:
            return self.outputs[name]
        if name not in self.inputs:
            self.inputs[name] = self._new("in_ptr")
        return self.inputs[name]

    def output(self, name: str) -> str:
        if name in self.inputs:
            # read and written: one in_out pointer (decided before any code names the pointer)
            self.inputs.pop(name)
            self.outputs[name] = self._new("in_out_ptr")
        if name not in self.outputs:
            self.outputs[name] = self._new("out_ptr")
        return self.outputs[name]

    def pointer(self, name: str, read: bool, written: bool) -> str:
        """The pointer of a buffer whose use is known up front: in_ptr, out_ptr or in_out_ptr."""
        if not written:
            return self.input(name)
        if read and name not in self.outputs:
            self.outputs[name] = self._new("in_out_ptr")
        return self.output(name)

    def accumulate(self, name: str) -> str:
        """The pointer of an output the kernel adds into (atomic adds): what it held before the launch counts."""
        self.added_into.add(name)
        return self.output(name)

    def read_back(self) -> set[str]:
        """Outputs whose contents before the launch the launch reads: read and written (in_out pointers) or
        added into. A second launch leaves them different; every other output it writes again as before."""
        return {n for n, p in self.outputs.items() if p.startswith("in_out_ptr")} | self.added_into

    def written_positions(self) -> tuple[list, list]:
        """(positions in call_order of the buffers the kernel writes, of those it also reads back): what
        the autotuner restores after timing candidates."""
        ptrs, back = self.call_order(), self.read_back()
        return ([i for i, (_, buf) in enumerate(ptrs) if buf in self.outputs],
                [i for i, (_, buf) in enumerate(ptrs) if buf in back])

    def element(self, name: str, position: int) -> str:
        """The parameter holding `position`, for a load of that element of `name` (Buffer.elements_vary)."""
        return self.elements.setdefault((name, position), f"elem{len(self.elements)}")

    def size(self, sym: sympy.Symbol) -> str:
        self.sizes.setdefault(sym, str(sym))
        return self.sizes[sym]

    def call_order(self) -> list[tuple[str, str]]:
        """(kernel parameter, buffer name) for pointer args, in parameter order."""
        ptrs = list(self.inputs.items()) + list(self.outputs.items())
        return [(p, n) for n, p in ptrs]


def shared_pointers(kernels) -> ArgRegistry:
    """One function's pointers for the buffers of several independent kernels it runs (a buffer one writes,
    no other reads): each buffer once, in order of first use, read and/or written as any kernel uses it."""
    use: dict = {}
    for k in kernels:
        for param, buf in k.args.call_order():
            read, written = use.get(buf, (False, False))
            use[buf] = (read or not param.startswith("out_ptr"), written or "out_ptr" in param)
    reg = ArgRegistry()
    for buf, (read, written) in use.items():
        reg.pointer(buf, read, written)
    return reg


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def literal(value) -> Optional[str]:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if value != value:
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    return None


class Section:
    """A stretch of a reduction kernel's body: a "loop" over chunks of the row (rindex), or "flat"
    code run once per row. Values computed inside a loop are visible only inside it; values of flat
    sections, and loop results computed after the loop (`post`), are visible to every later section."""

    def __init__(self, kind: str, sid: int):
        self.kind, self.id = kind, sid
        self.pre: list[str] = []        # before the loop (accumulators, hoisted row-invariant values)
        self.body: list[str] = []
        self.post: list[str] = []       # after the loop (final reductions)
        self.chunk: list[str] = []      # C++: once per chunk of r, before its SIMD loop
        self.cache: dict = {}
        self.reductions: set[str] = set()
        self.barrier = False


class SectionedKernel:
    """What the kernel backends share about placing a fused group's nodes into sections: a node that
    reads a reduction finished in the current loop starts the next loop; a node with no r axis goes to
    straight-line code after it. Subclasses say when the whole kernel is one section."""
    sections: list
    scope: dict

    def single_section(self) -> bool:
        raise NotImplementedError

    def generate(self):
        """Run every node's store body under this kernel as the ops handler, section by section."""
        with handler(self):
            for node in self.nodes:
                self._enter(node)
                ivals, rvals = kernel_index_vars(node, self.group)
                node.buf.store_body(ivals, rvals)
                self._leave(node)
        return self

    def emit(self, line: str, where: str = "body"):
        getattr(self.section, where).append(line)

    def store(self, name, index, value, mode=None):
        return self._store(name, index, value, "body", mode)

    def reduction(self, dtype, src_dtype, rtype, value: KValue):
        """A kernel without an r axis reduces rows of one element; otherwise the backend's `_reduce`."""
        key = f"reduction:{rtype}:{value.name}:{dtype}"
        hit = self.section.cache.get(key) or self.global_cache.get(key)
        if hit is not None:
            return hit
        if self.has_rdim:
            out = self._reduce(dtype, src_dtype, rtype, value)
        else:
            out = one_element_reduction(self, rtype, value, dtype)
        self.global_cache[key] = out
        return out

    def _cached(self, expr: str):
        """The value already named for `expr` where the current section can see it, else None."""
        hit = self.section.cache.get(expr) or self.global_cache.get(expr)
        return hit if hit is not None and self._visible(hit) else None

    def _enter(self, node):
        cur = self.sections[-1] if self.sections else None
        if self.single_section():
            if cur is None:
                self._new_section("flat")
            return
        has_r = node.is_reduction() or not node.is_x_only(self.group)
        if has_r:
            if cur is None or cur.kind != "loop" or (node.reads & cur.reductions):
                self._new_section("loop")
        elif cur is None or cur.kind != "flat":
            self._new_section("flat")

    def _leave(self, node):
        if node.is_reduction():
            self.sections[-1].reductions |= {node.name, node.buf.storage_name()}

    def _new_section(self, kind):
        self.sections.append(Section(kind, len(self.sections)))

    @property
    def section(self) -> Section:
        return self.sections[-1]

    def _visible(self, v: KValue) -> bool:
        s = self.scope.get(v.name)
        return s is None or s == self.section.id
