"""Index arithmetic for the C++ kernels: printing sympy indices as C++, simplifying them with the
kernel's loop bounds, choosing the 2-D loop ("rows") a pointwise kernel runs as, and the C++ backend's
tiling policy.

A pointwise kernel over a flat `xindex` reads a broadcast or permuted input through `xindex % n` and
`xindex / n`: inside a SIMD loop every such load is a gather. Split the flat index into rows and
row elements at a dimension boundary (xindex -> row, rindex) and most of those indices become affine
in the inner index: contiguous vector loads, or one value per row hoisted out of the SIMD loop.
"""
from __future__ import annotations

import functools
from typing import Optional

import sympy

from ...ir.symbolic import (FloorDiv, ModularIndexing, Remembered, expand_index, free_symbols, hint,
                             simplify_index, size_symbols, terms_with, tree_size)
from ...schedule.nodes import RINDEX, XINDEX, canonical
from ...schedule.tiling import TilingPolicy
from ..kernel import IndexPrinter

MIN_ROW = 16      # shorter rows than this run as one flat loop: a row of SIMD work would be mostly remainder
# 2-D tiles (schedule/tiling.choose_tiling) for transposes only: accesses contiguous along two different
# dims. A single non-last contiguous dim (channels-last walked in NCHW order) runs as rows instead
# (choose_rows), and a node without the inner axis would be recomputed for every element of its tile row.
CPP_TILING = TilingPolicy(min_extent=MIN_ROW, one_contiguous_dim=False, every_node_inner=True)


class CppIndexPrinter(IndexPrinter):
    """Index arithmetic as C++ int64 expressions (all operands non-negative, so / and % floor).
    Sizes from Dynamo's ShapeEnv carry torch's own sympy functions (FloorDiv, CleanDiv, Mod ...),
    which print themselves as Python (`//`) through `_sympystr`: dispatch on class names instead."""

    printmethod = "_ember_cpp_print"
    floordiv = "/"

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"({self._paren(a)} % {self._paren(b)})"

    _print_PythonMod = _print_Mod

    def _print_CeilDiv(self, expr):
        a, b = expr.args
        return f"(({self._paren(a)} + {self._paren(b)} - 1) / {self._paren(b)})"

    def _print_Identity(self, expr):
        return self._print(expr.args[0])

    def _minmax(self, fn, args):
        out = self._print(args[0])
        for a in args[1:]:
            out = f"ember::i{fn}({out}, {self._print(a)})"
        return out

    def _print_Integer(self, expr):
        v = int(expr)
        return str(v) if -2 ** 31 < v < 2 ** 31 else f"{v}LL"


_printer = CppIndexPrinter()


@functools.lru_cache(maxsize=65536, typed=True)
def cpp_index(expr) -> str:
    # remembered, as print_index is
    return _printer.doprint(sympy.sympify(expr))


# -- sizes named once per kernel ---------------------------------------------------------------------------

def _sizes_only(e) -> bool:
    return len(size_symbols(e)) == len(free_symbols(e))


class SizeNames:
    """The compound expressions in the sizes that a kernel's indices hold (FloorDiv(s0 - 1, 4) + 1, a view's
    inferred size as a quotient of sizes), each computed once at the kernel's start as `ks<n>` and printed
    by that name: under dynamic shapes the same few size expressions recur in every index, and printed
    inline a view of a view's index reached 167 kB a line (MobileViT's patch unfolding), which g++ then
    parsed for minutes. Static kernels have none: their sizes are integers."""

    def __init__(self):
        self.names: dict = {}                 # expression -> its symbol, in the order they were named
        self._named: dict = {}                # index -> the index with its size expressions named

    def __call__(self, index):
        out = self._named.get(index)
        if out is None:
            out = self._named[index] = self._name(index) if size_symbols(index) else index
        return out

    def _name(self, e):
        if e.is_Atom:
            return e
        if _sizes_only(e):
            if not e.has(FloorDiv, ModularIndexing) and tree_size(e) <= 3:
                return e                      # s0*s1, 2*s0 + 1: as short as a name
            if e not in self.names:
                self.names[e] = sympy.Symbol(f"ks{len(self.names)}", integer=True, positive=True)
            return self.names[e]
        if (e.is_Add or e.is_Mul) and sum(_sizes_only(a) and not a.is_Number for a in e.args) > 1:
            # the terms (factors) in the sizes alone, together, are one expression to name
            sized = e.func(*[a for a in e.args if _sizes_only(a)])
            rest = [self._name(a) for a in e.args if not _sizes_only(a)]
            return e.func(*rest, self._name(sized), evaluate=False)
        args = [self._name(a) for a in e.args]
        if all(a is b for a, b in zip(args, e.args)):
            return e                          # nothing named inside: printed as it was
        return e.func(*args, evaluate=False)

    def definitions(self) -> list[str]:
        """C++ lines declaring each name, for the top of the kernel's function."""
        return [f"  const int64_t {name} = {cpp_index(e)};" for e, name in self.names.items()]


# -- choosing the rows of a pointwise kernel --------------------------------------------------------------

def _vector_friendly(e, var) -> bool:
    """Affine in `var` with step 0 or 1: a broadcast or contiguous access in a SIMD loop over var."""
    if any(var in f.free_symbols for f in e.atoms(FloorDiv, ModularIndexing)):
        return False
    # outside floors and moduli the index is a polynomial: var's terms in the expanded sum are none or var
    return terms_with(e, var) in ([], [var])


def _split_rows(expr, X, R):
    flat = simplify_index(sympy.sympify(expr), ((XINDEX, X),))
    e = expand_index(flat.xreplace({XINDEX: R * XINDEX + RINDEX}))
    ranges = ((XINDEX, _exact_div(X, R)), (RINDEX, R))
    return simplify_index(e, ranges)


# split_rows(expr, X, R): a flat pointwise index in terms of rows of R elements: xindex -> R*xindex + rindex,
# simplified with 0 <= rindex < R (valid for any R that divides X). Remembered: choosing the rows tries
# every candidate R on every access, and kernels of repeated layers ask the same
split_rows = Remembered(_split_rows)


def _exact_div(X, R):
    q = sympy.cancel(sympy.sympify(X) / R)
    return q if sympy.fraction(q)[1] == 1 else None


def _boundaries(e) -> set:
    """Where a flat index changes pattern: the divisors and periods of floors and moduli of xindex."""
    out = set()
    for f in e.atoms(FloorDiv, ModularIndexing):
        if f.args[0] != XINDEX:
            continue
        out.add(f.args[1])
        if isinstance(f, ModularIndexing):
            out.add(f.args[1] * f.args[2])
    return out


# Indices longer than this are not tried as rows: each candidate row length rewrites and simplifies every
# index again, and the views of views of a dynamic-shape graph (MobileViT's patch unfolding, sizes such as
# ceil(s / 16)) reach thousands of nodes, where the tries took minutes per graph
ROWS_MAX_INDEX_NODES = 400


def choose_rows(group) -> tuple[Optional[sympy.Expr], int]:
    """(R, awkward): the row length R to run a pointwise group as rows (a loop over rows, a SIMD loop
    along each row), or None to keep one flat loop (already vector-friendly, or no row length helps);
    `awkward` counts the accesses that stay gathers. Candidates are where the flat indices change
    pattern; the fewest awkward accesses win, then the longest row."""
    if group.is_reduction() or not group.is_kernel():
        return None, 0
    X = group.group[0]
    flat_group = (X, sympy.Integer(1))
    exprs = []
    for n in group.nodes:
        subs = n.flat_vars(flat_group)
        exprs += [canonical(d.index, subs, flat_group) for d in n.read_deps + n.write_deps]
    flat = sum(not _vector_friendly(e, XINDEX) for e in exprs)
    if flat == 0 or max(tree_size(e) for e in exprs) > ROWS_MAX_INDEX_NODES:
        return None, flat
    best = None
    for R in set().union(*(_boundaries(e) for e in exprs)):
        if R == 1 or hint(R) < MIN_ROW or _exact_div(X, R) is None:
            continue
        score = (sum(not _vector_friendly(split_rows(e, X, R), RINDEX) for e in exprs), -hint(R))
        if best is None or score < best[0]:
            best = (score, R)
    if best is not None and best[0][0] < flat:
        return best[1], best[0][0]
    return None, flat
