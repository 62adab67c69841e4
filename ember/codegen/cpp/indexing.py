"""Index arithmetic for the C++ kernels: printing sympy indices as C++, simplifying them with the
kernel's loop bounds, and choosing the 2-D loop ("rows") a pointwise kernel runs as.

A pointwise kernel over a flat `xindex` reads a broadcast or permuted input through `xindex % n` and
`xindex / n`: inside a SIMD loop every such load is a gather. Split the flat index into rows and
row elements at a dimension boundary (xindex -> row, rindex) and most of those indices become affine
in the inner index: contiguous vector loads, or one value per row hoisted out of the SIMD loop.
"""
from __future__ import annotations

import functools
from typing import Optional

import sympy

from ...ir.symbolic import FloorDiv, ModularIndexing, hint, product, simplify_index
from ...schedule.nodes import RINDEX, XINDEX, canonical
from ..kernel import IndexPrinter

MIN_ROW = 16      # shorter rows than this run as one flat loop: a row of SIMD work would be mostly remainder


class CppIndexPrinter(IndexPrinter):
    """Index arithmetic as C++ int64 expressions (all operands non-negative, so / and % floor).
    Sizes from Dynamo's ShapeEnv carry torch's own sympy functions (FloorDiv, CleanDiv, Mod ...),
    which print themselves as Python (`//`) through `_sympystr`: dispatch on class names instead."""

    printmethod = "_ember_cpp_print"

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"({self._paren(a)} % {self._paren(b)})"

    _print_PythonMod = _print_Mod

    def _print_CeilDiv(self, expr):
        a, b = expr.args
        return f"(({self._paren(a)} + {self._paren(b)} - 1) / {self._paren(b)})"

    def _print_Identity(self, expr):
        return self._print(expr.args[0])

    def _print_FloorDiv(self, expr):
        a, b = expr.args
        return f"({self._paren(a)} / {self._paren(b)})"

    def _print_ModularIndexing(self, expr):
        a, d, m = expr.args
        inner = self._paren(a) if d == 1 else f"({self._paren(a)} / {self._paren(d)})"
        return f"({inner} % {self._paren(m)})"

    def _minmax(self, fn, args):
        out = self._print(args[0])
        for a in args[1:]:
            out = f"ember::i{fn}({out}, {self._print(a)})"
        return out

    def _print_Integer(self, expr):
        v = int(expr)
        return str(v) if -2 ** 31 < v < 2 ** 31 else f"{v}LL"


_printer = CppIndexPrinter()


def cpp_index(expr) -> str:
    return _printer.doprint(sympy.sympify(expr))


# -- simplification with loop bounds ----------------------------------------------------------------------

def _upper(term, maxes: dict) -> Optional[int]:
    """An inclusive upper bound of a non-negative index term, or None if unknown."""
    if term.is_Integer:
        return int(term) if term >= 0 else None
    if term in maxes:
        return maxes[term]
    if isinstance(term, ModularIndexing) and term.args[2].is_Integer:
        return int(term.args[2]) - 1
    if isinstance(term, FloorDiv) and term.args[1].is_Integer:
        b = _upper(term.args[0], maxes)
        return None if b is None else b // int(term.args[1])
    if term.is_Mul:
        c, rest = term.as_coeff_Mul()
        b = _upper(rest, maxes) if c.is_Integer and c > 0 else None
        return None if b is None else int(c) * b
    if term.is_Add:
        bs = [_upper(t, maxes) for t in term.args]
        return None if None in bs else sum(bs)
    return None


def _split_base(base, d: int, maxes: dict):
    """base = a*q + w with a | d and 0 <= w < a (so base // d == q // (d/a)): (q, a), or None.
    The largest such a wins; it drops the most from the floor."""
    terms = [t.as_coeff_Mul() for t in sympy.Add.make_args(base)]
    if any(not c.is_Integer or c < 0 for c, _ in terms):
        return None
    for a in sorted({int(c) for c, _ in terms if int(c) > 1 and d % int(c) == 0} | {d}, reverse=True):
        big = [(c, r) for c, r in terms if int(c) % a == 0]
        small = [c * r for c, r in terms if int(c) % a != 0]
        if not big:
            continue
        bound = _upper(sympy.Add(*small), maxes) if small else 0
        if bound is not None and bound < a:
            return sympy.Add(*[(int(c) // a) * r for c, r in big]), a
    return None


def _bounded(e, maxes: dict):
    base, d = e.args[0], e.args[1]
    if not d.is_Integer:
        return e
    d = int(d)
    top = _upper(base, maxes)
    if isinstance(e, FloorDiv):
        if top is not None and top < d:
            return sympy.Integer(0)
        sp = _split_base(base, d, maxes)
        return e if sp is None else FloorDiv(sp[0], sympy.Integer(d // sp[1]))
    m = e.args[2]
    if top is not None and top < d:
        return sympy.Integer(0)
    if d == 1 and top is not None and m.is_Integer and top < int(m):
        return base
    if d == 1 and m.is_Integer:
        # (a*q + w) % m == a*(q % (m/a)) + w when a | m and 0 <= w < a (a tile of a flattened dim)
        for a in sorted({int(c) for c, _ in (t.as_coeff_Mul() for t in sympy.Add.make_args(base))
                         if c.is_Integer and int(c) > 1 and int(m) % int(c) == 0}, reverse=True):
            sp = _split_base(base, a, maxes)
            if sp is not None and sp[1] == a:
                w = sympy.expand(base - a * sp[0])
                return a * ModularIndexing(sp[0], sympy.Integer(1), sympy.Integer(int(m) // a)) + w
    sp = _split_base(base, d, maxes)
    return e if sp is None else ModularIndexing(sp[0], sympy.Integer(d // sp[1]), m)


@functools.lru_cache(maxsize=65536)
def _simplify_bounded(expr, maxes_items: tuple):
    maxes = dict(maxes_items)
    for _ in range(4):
        new = expr.replace(lambda e: isinstance(e, (FloorDiv, ModularIndexing)), lambda e: _bounded(e, maxes))
        if new == expr:
            break
        expr = new
    return expr


def simplify_bounded(expr, ranges) -> sympy.Expr:
    """Drop floors and moduli that the loop bounds make redundant: `(256*x + r) // 32768` is
    `x // 128` when r < 256, which `simplify_index` (no bounds on sums) keeps. `ranges` are
    (var, extent) pairs; only integer extents count."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    maxes = tuple((v, int(n) - 1) for v, n in ranges if sympy.sympify(n).is_Integer)
    return _simplify_bounded(expr, maxes)


# -- choosing the rows of a pointwise kernel --------------------------------------------------------------

def _vector_friendly(e, var) -> bool:
    """Affine in `var` with step 0 or 1: a broadcast or contiguous access in a SIMD loop over var."""
    if any(var in f.free_symbols for f in e.atoms(FloorDiv, ModularIndexing)):
        return False
    try:
        return sympy.diff(e, var) in (0, 1)
    except (TypeError, ValueError):
        return False


def split_rows(expr, X, R):
    """A flat pointwise index in terms of rows of R elements: xindex -> R*xindex + rindex, simplified
    with 0 <= rindex < R (valid for any R that divides X)."""
    flat = simplify_index(sympy.sympify(expr), ((XINDEX, X),))
    e = sympy.expand(flat.xreplace({XINDEX: R * XINDEX + RINDEX}))
    ranges = ((XINDEX, _exact_div(X, R)), (RINDEX, R))
    return simplify_bounded(simplify_index(e, ranges), ranges)


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
    if flat == 0:
        return None, 0
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


# -- transposes ----------------------------------------------------------------------------------------------

def _unit_stride_dim(expr, ivars) -> Optional[int]:
    for k, v in enumerate(ivars):
        try:
            if sympy.diff(expr, v) == 1:
                return k
        except (TypeError, ValueError):
            return None
    return None


def choose_tiles(group) -> Optional[tuple]:
    """(X, R) to run a pointwise group as 2-D tiles (a transpose: accesses contiguous along two different
    dims), as schedule/tiling.choose_tiling decides, but on indices simplified with each node's loop
    bounds first: a view of a view leaves `(128*i1 + i2) // 128 % 64` where it means i1, which hides
    the contiguous dim."""
    if group.is_reduction() or not group.is_kernel():
        return None
    for n in group.nodes:
        if len(n.ranges) < 2 or n.has_indirect:
            continue
        bounds = tuple(zip(n.ivars, n.ranges))
        dims = {_unit_stride_dim(simplify_bounded(simplify_index(sympy.sympify(d.index), bounds), bounds), n.ivars)
                for d in n.read_deps + n.write_deps}
        dims.discard(None)
        if len(dims) < 2 or max(dims) == 0:
            continue
        split = max(dims)
        X, R = product(n.ranges[:split]), product(n.ranges[split:])
        if hint(X) < MIN_ROW or hint(R) < MIN_ROW:
            return None
        if all((m.split((X, R)) or (None, None))[1] for m in group.nodes):
            return (X, R)
    return None
