"""Sizes and indices as sympy expressions.

Sizes are integers for static graphs and symbols (s0, s1 ...) for dynamic ones. Index arithmetic uses
two integer functions of our own, FloorDiv(a, b) and ModularIndexing(a, d, m) = (a // d) % m, so that
the printer and the simplifier know exactly what they mean (sympy's floor/Mod are slower and looser).

`simplify_index` merges the terms that loop flattening produces:
    c*m*ModularIndexing(v, d*m, k) + c*ModularIndexing(v, d, m)  ->  c*ModularIndexing(v, d, m*k)
with FloorDiv(v, d) standing for ModularIndexing(v, d, oo); so `N*(x // N) + x % N` becomes `x`. Given
the index variables' extents it also drops the floors and moduli their bounds decide (`simplify_bounded`).

Sizes from torch (SymInts, and the graph's own size arithmetic) enter through `integer_form`, which writes
torch's integer functions and sympy's floor, ceiling and Mod as FloorDiv and ModularIndexing.
"""
from __future__ import annotations

import functools
from typing import Iterable, Optional, Sequence

import sympy
import torch

from .. import state

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(base, ModularIndexing) and base.args[2].is_Integer and divisor.is_Integer:
            v, d, m = base.args
            if int(m) <= int(divisor):
                return sympy.Integer(0)            # (v // d) % m < m <= divisor
            if int(m) % int(divisor) == 0:
                return ModularIndexing(v, d * divisor, m / divisor)
        # (a*d + b) // d == a + b // d when every term but b is a multiple of d
        if base.is_Add:
            whole, rest = _split_multiples(base.args, divisor)
            if whole and rest:
                return sympy.Add(*[_quotient(t, divisor) for t in whole]) + FloorDiv(sympy.Add(*rest), divisor)
            if whole and not rest:
                return sympy.Add(*[_quotient(t, divisor) for t in whole])
        return _exact_quotient(base, divisor)

    def _eval_is_nonnegative(self):
        base, divisor = self.args
        return True if base.is_nonnegative and divisor.is_positive else None


class ModularIndexing(sympy.Function):
    """(base // divisor) % modulus, for non-negative base."""
    is_integer = True
    nargs = (3,)

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if isinstance(base, ModularIndexing) and base.args[2].is_Integer and divisor.is_Integer \
                and modulus.is_Integer and int(base.args[2]) % (int(divisor) * int(modulus)) == 0:
            v, d, _ = base.args      # the inner modulus is a multiple of what the outer keeps
            return ModularIndexing(v, d * divisor, modulus)
        if isinstance(base, FloorDiv):
            return ModularIndexing(base.args[0], base.args[1] * divisor, modulus)
        if base.is_Add:
            # terms that are multiples of divisor*modulus do not change the result
            dropped, keep = _split_multiples(base.args, divisor * modulus)
            if dropped:
                return ModularIndexing(sympy.Add(*keep), divisor, modulus)
        return None

    def _eval_is_nonnegative(self):
        base, divisor, modulus = self.args
        return True if base.is_nonnegative and divisor.is_positive and modulus.is_positive else None


@functools.lru_cache(maxsize=65536)
def _simplify(expr: Expr) -> Expr:
    """Cancel common factors of a quotient or difference of size/index polynomials. sympy.cancel
    (polynomial gcd; floor/mod terms are opaque generators) does what these call sites need at a
    fraction of sympy.simplify's cost, which dominated compiles of graphs with symbolic sizes."""
    expr = sympy.sympify(expr)
    if expr.is_number or expr.is_Symbol:
        return expr
    try:
        return sympy.cancel(expr)
    except Exception:          # noqa: BLE001  (a form cancel cannot handle: leave it as it is)
        return expr


def _split_multiples(terms, divisor: Expr):
    """The terms of a sum that are multiples of divisor, to take out of a floor or modulus, and the rest.
    Kernels print FloorDiv and ModularIndexing as the C division and remainder, which agree with Python's
    only for a non-negative base: a positive multiple stays in when the rest might be negative
    ((4 - s % 4) % 4 is not (-(s % 4)) % 4 in C)."""
    whole = [t for t in terms if _is_multiple(t, divisor)]
    if not whole:
        return [], list(terms)
    rest = [t for t in terms if not any(t is w for w in whole)]
    if sympy.Add(*rest).is_nonnegative:
        return whole, rest
    out = [t for t in whole if t.is_nonpositive]
    return out, rest + [t for t in whole if not t.is_nonpositive]


def _is_integer_product(q: Expr) -> bool:
    """q is a product of integer factors as written (no factor divides): sympy's own Mul already cancels
    the factors a term and its divisor share, so this answers most multiples without a polynomial gcd."""
    for f in sympy.Mul.make_args(q):
        if f.is_Number:
            if not f.is_Integer:
                return False
        elif (f.is_Pow and not (f.exp.is_Integer and f.exp > 0)) or not f.is_integer:
            return False
    return True


def _is_monomial(e: Expr) -> bool:
    """e is a number times powers of atoms (symbols, floors, moduli): no sum inside for a gcd to find."""
    for f in sympy.Mul.make_args(e):
        if f.is_Pow:
            f = f.base
        if not (f.is_Number or f.is_Symbol or isinstance(f, (FloorDiv, ModularIndexing))):
            return False
    return True


@functools.lru_cache(maxsize=65536)
def _primitive(e: Expr) -> Expr:
    """e with each sum among its factors written as its content times a primitive sum (4*F + 4 ->
    4*(F + 1)): a size such as ceil(s / 16) = FloorDiv(s - 1, 16) + 1 reaches indices both ways, and
    written alike its occurrences cancel as factors."""
    def primitive(f):
        if f.is_Add:
            return sympy.factor_terms(f)
        if f.is_Pow and f.base.is_Add:
            return sympy.Pow(sympy.factor_terms(f.base), f.exp)
        return f
    return sympy.Mul(*[primitive(f) for f in sympy.Mul.make_args(e)])


@functools.lru_cache(maxsize=65536)
def tree_size(e: Expr) -> int:
    """The number of nodes of e's expression tree."""
    return sum(1 for _ in sympy.preorder_traversal(e))


# Above this many nodes an index is not cancelled against a divisor (a polynomial gcd over every floor and
# modulus in it as a generator): on MobileViT's views of views under dynamic shapes such calls took up to
# seconds each and never found a multiple that the factor-wise check had not
CANCEL_MAX_NODES = 100


@functools.lru_cache(maxsize=65536, typed=True)
def _exact_quotient(term: Expr, divisor: Expr) -> Optional[Expr]:
    """term / divisor where term is divisible by divisor for every value of the sizes, multiplied out; None
    where that is not known. Factor by factor first (sympy's Mul cancels the factors a term and its divisor
    share, and sums written as content times a primitive sum cancel alike); a polynomial gcd only for
    short indices whose factors hold sums."""
    if divisor == 1:
        return term
    terms = sympy.Add.make_args(term)
    quotients = [t / divisor for t in terms]
    if all(_is_integer_product(q) for q in quotients):
        return expand_index(sympy.Add(*quotients))
    if _is_monomial(divisor) and all(_is_monomial(t) for t in terms):
        # a sum of monomials is a multiple of a monomial only term by term: cancelling finds nothing more,
        # and on the long indices of views of views it cost milliseconds per call
        return None
    d = _primitive(divisor)
    quotients = [_primitive(t) / d for t in terms]
    if all(_is_integer_product(q) for q in quotients):
        return expand_index(sympy.Add(*quotients))
    if tree_size(term) + tree_size(divisor) > CANCEL_MAX_NODES or not _divides_at_samples(term, divisor):
        return None
    q = _simplify(term / divisor)
    if q.is_integer or (q.is_Mul and all(a.is_integer for a in q.args)):
        return q
    return None


# Integer values for every symbol of a term and its divisor (two draws, by the symbols' order): a term that
# is a multiple of its divisor for every value of the sizes and indices is one at these values too
_SAMPLES = ((1009, 1013, 1019, 1021, 1031, 1033, 1039), (2003, 2011, 2017, 2027, 2029, 2039, 2053))


def _divides_at_samples(term: Expr, divisor: Expr) -> bool:
    """False where term / divisor is no integer at some sample values of their symbols: then no polynomial
    gcd can find it a multiple, and most candidates that reach one are not (the checks inside ModularIndexing
    and FloorDiv ask of every term of a long index). True where they divide there, or cannot be evaluated."""
    term, divisor = sympy.sympify(term), sympy.sympify(divisor)
    symbols = sorted(free_symbols(term) | free_symbols(divisor), key=str)
    for values in _SAMPLES:
        at = {x: sympy.Integer(values[i % len(values)] + 2 * (i // len(values))) for i, x in enumerate(symbols)}
        t, d = term.xreplace(at), divisor.xreplace(at)
        if not (t.is_Integer and d.is_Integer) or d == 0:
            return True
        if int(t) % int(d):
            return False
    return True


def _is_multiple(term: Expr, divisor: Expr) -> bool:
    """Whether term is divisible by divisor for every value of the sizes (False where that is not known)."""
    return _exact_quotient(term, divisor) is not None


def _quotient(term: Expr, divisor: Expr) -> Expr:
    """term / divisor for a term found divisible."""
    q = _exact_quotient(term, divisor)
    return _simplify(term / divisor) if q is None else q


class Remembered:
    """fn's results by its arguments (sympy values, numbers and tuples of them), for index arithmetic that
    every run of an inner_fn repeats: dependencies, fusion checks, the structural key and each kernel
    backend run the same bodies. A key holds each value's type too: a Python int and the sympy Integer
    equal to it are equal dict keys but give results of different types. Unhashable arguments are computed,
    not remembered."""

    def __init__(self, fn, max_size: int = 1 << 16):
        self.fn, self.max_size, self.results = fn, max_size, {}

    def __call__(self, *args):
        try:
            key = (args, _types(args))
            out = self.results.get(key, self)
        except TypeError:
            return self.fn(*args)
        if out is self:
            out = self.fn(*args)
            if len(self.results) >= self.max_size:
                self.results.clear()
            self.results[key] = out
        return out


def _types(x):
    if type(x) is not tuple:
        return type(x)
    types = tuple(map(type, x))
    return tuple(_types(a) for a in x) if tuple in types else types


def sympify(x) -> Expr:
    """int / SymInt / sympy expr -> sympy expr."""
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        return sympy.Integer(int(x))
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, torch.SymInt):
        # settled in torch's spelling, which the ShapeEnv reasons about, then written in ember's
        return integer_form(settle_min_max(x.node.expr, x.node.shape_env))
    raise TypeError(f"cannot use {type(x).__name__} {x!r} as a size")


@functools.lru_cache(maxsize=65536)
def integer_form(expr: Expr) -> Expr:
    """An integer-valued size expression in ember's one spelling of integer division: FloorDiv and
    ModularIndexing, never a Rational. Sizes reach ember written by torch's ShapeEnv (its FloorDiv,
    CleanDiv, Mod, FloorToInt(IntTrueDiv(a, b)) ...) and by Python arithmetic on sympy values (`a // b` is
    sympy's floor(a/b), `a % b` its Mod); one quantity spelled two ways in one index neither simplifies
    nor prints as integer arithmetic. Operands are sizes, so non-negative, as ember's FloorDiv assumes.
    The caller knows the value is an integer: a quotient left as a fraction is exact (s*(s + 1)/2)."""
    out = _integer_functions(sympy.sympify(expr))
    if has_division(out):
        out = _floor_of_ratio(out, ceil=False) or out
    return out


def exact_fraction(expr: Expr) -> Expr | None:
    """expr with each float written as the fraction it is, where that changes nothing: a float whose binary
    fraction has at most EXACT_FLOAT_BITS significant bits times a size (under 2**31) is exact in float64,
    so rounding Python's float product down gives the fraction's floor (`trunc(float(s) * 1.5)` is
    floor(3*s/2)). None where a float has more bits: float(s) * 1.7 rounds in float64 (10 * 1.7 is 17.0,
    where the float nearest 1.7 times 10 is below 17), which no exact expression of s reproduces."""
    floats = {}
    for f in expr.atoms(sympy.Float):
        q = sympy.Rational(float(f))
        if q.q & (q.q - 1) or abs(q.p).bit_length() > EXACT_FLOAT_BITS:
            return None
        floats[f] = q
    return expr.xreplace(floats) if floats else expr


EXACT_FLOAT_BITS = 21


@functools.lru_cache(maxsize=65536)
def expand_index(expr: Expr) -> Expr:
    """sympy.expand(expr), without its cost where there is nothing to multiply out (no product or power
    of a sum anywhere in the tree), as in most indices: expand rebuilds every node of a long index."""
    for e in sympy.preorder_traversal(expr):
        if (e.is_Mul and any(a.is_Add for a in e.args)) or (e.is_Pow and e.base.is_Add):
            return sympy.expand(expr)
    return expr


def terms_with(expr: Expr, var) -> list:
    """The terms of expr's expanded sum that hold var (var itself for an index that moves by one along it)."""
    return [t for t in sympy.Add.make_args(expand_index(expr)) if var in free_symbols(t)]


def has_division(expr: Expr) -> bool:
    """Whether expr divides outside FloorDiv / ModularIndexing: a fraction, or a negative power (a size a
    view infers as numel / (the other sizes), which sympy cannot cancel)."""
    return any(not r.is_Integer for r in expr.atoms(sympy.Rational)) or \
        any(p.exp.is_negative for p in expr.atoms(sympy.Pow))


@functools.lru_cache(maxsize=65536)
def _integer_functions(expr: Expr) -> Expr:
    if expr.is_Atom:
        return expr
    return _integer_function(expr, [_integer_functions(a) for a in expr.args])


def _integer_function(expr: Expr, args: list) -> Expr:
    name = type(expr).__name__
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        return expr.func(*args)
    if name in ("FloorDiv", "CleanDiv"):                   # torch's: CleanDiv is one known to be exact
        return FloorDiv(*args)
    if name == "CeilDiv":
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if isinstance(expr, sympy.Mod) or name in ("Mod", "PythonMod"):
        return ModularIndexing(args[0], sympy.Integer(1), args[1])
    if name == "ToFloat":                                  # torch's: an integer as a float
        return args[0]
    if isinstance(expr, (sympy.floor, sympy.ceiling)) or name in ("FloorToInt", "CeilToInt", "TruncToInt"):
        exact = exact_fraction(args[0])     # a size times a float (a resize's scaled size); trunc of a size is floor
        out = None if exact is None else \
            _floor_of_ratio(exact, ceil=isinstance(expr, sympy.ceiling) or name == "CeilToInt")
        return expr.func(*args) if out is None else out
    if name == "PowByNatural":
        return sympy.Pow(*args)
    if name == "Identity":
        return args[0]
    if name in ("Min", "Max") and not isinstance(expr, (sympy.Min, sympy.Max)):   # torch's own Min / Max
        return (sympy.Min if name == "Min" else sympy.Max)(*args)
    return expr.func(*args) if tuple(args) != expr.args else expr


def _floor_of_ratio(x: Expr, ceil: bool) -> Optional[Expr]:
    """floor(a / b) (ceil: ceil(a / b)) of integers a, b as FloorDiv; None for another argument. b is a
    size or a quotient of sizes (Hp // (Hp // w)): positive, though sympy rarely knows it."""
    if type(x).__name__ == "IntTrueDiv":
        num, den = x.args
    else:
        num, den = sympy.fraction(sympy.together(x))
    if not (num.is_integer and den.is_integer) or den.is_nonpositive:
        return None
    num = sympy.expand(num)
    return FloorDiv(num + den - 1 if ceil else num, den)


def settle_min_max(expr: Expr, env=None) -> Expr:
    """Min(512, s0) is s0 when the guards already say s0 <= 512 (a slice of a fixed-size buffer by a
    sequence length, as models slice their position ids): the size then compares equal to the other
    tensors' s0, so the kernels that use both can fuse."""
    env = env if env is not None else _shape_env()
    if env is None or not expr.has(sympy.Min, sympy.Max):
        return expr

    def settle(e):
        for a in e.args:
            rest = [b for b in e.args if b is not a]
            rel = sympy.Le if isinstance(e, sympy.Min) else sympy.Ge
            try:
                if all(env._maybe_evaluate_static(rel(a, b)) == sympy.true for b in rest):
                    return a
            except Exception:          # noqa: BLE001  (the ShapeEnv cannot decide: keep the Min/Max)
                return e
        return e
    return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), settle)


def sympy_list(xs: Iterable) -> list[Expr]:
    return [sympify(x) for x in xs]


def product(xs: Iterable) -> Expr:
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


def contiguous_strides(size: Sequence[Expr]) -> list[Expr]:
    strides, acc = [], sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


def index_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def make_index_vars(prefix: str, n: int) -> list[sympy.Symbol]:
    return [index_var(prefix, i) for i in range(n)]


def statically_known_equal(a, b) -> bool:
    return _simplify(sympify(a) - sympify(b)) == 0


def is_static(x) -> bool:
    return isinstance(sympify(x), sympy.Integer)


def hint(x) -> int:
    """A concrete value for a size: the integer itself, or the symbol's example value from the ShapeEnv."""
    x = sympify(x)
    if isinstance(x, sympy.Integer):
        return int(x)
    g = _hint_source() or {}
    # symbols with no example value (unbacked: sizes that depend on data, e.g. nonzero's) get a
    # typical size; hints only steer heuristics, never correctness
    value = x.subs(g).subs({s: UNBACKED_HINT for s in x.free_symbols})
    return int(value)


UNBACKED_HINT = 8192


def _hint_source():
    g = state.graph.get()
    return None if g is None else g.symbol_hints


def _shape_env():
    g = state.graph.get()
    return None if g is None else getattr(g, "shape_env", None)


def guard_le(x, limit: int) -> bool:
    """Is `x <= limit` for every size this graph will run with? True when the sizes decide it, or when the
    example sizes satisfy it and a guard on it was installed with the ShapeEnv (Dynamo then recompiles
    for sizes that break it). False when that cannot be promised: the caller keeps the choice that is
    valid for every size."""
    x = sympify(x)
    if x.is_Integer:
        return int(x) <= limit
    env, hints = _shape_env(), _hint_source() or {}
    # unbacked symbols (sizes that depend on data) have no example value to decide from; torch's own
    # functions and ember's index functions are left out, so the guard prints as Python in Dynamo's
    # guard code
    if env is None or not x.free_symbols <= hints.keys() or not _is_polynomial(x) or hint(x) > limit:
        return False
    try:
        upper = env.bound_sympy(x).upper
        if upper.is_Integer and int(upper) <= limit:
            return True
        # a guard must not narrow a declared range (mark_dynamic(min=, max=)): Dynamo reports that as a
        # constraint violation instead of recompiling. A frozen ShapeEnv (a backward compiled lazily,
        # after Dynamo produced its guards) and suppressed guards drop the guard silently: the decision
        # would then hold for no size.
        if any(_declared_max(env, s) for s in x.free_symbols) or getattr(env, "frozen", True) \
                or _guards_suppressed(env):
            return False
        return bool(env.evaluate_expr(sympy.Le(x, sympy.Integer(limit))))
    except Exception:          # noqa: BLE001  (any trouble guarding: keep the choice valid for every size)
        return False


def _is_polynomial(x: Expr) -> bool:
    return x.is_polynomial() and all(isinstance(e, (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul, sympy.Pow))
                                     for e in sympy.preorder_traversal(x))


def _declared_max(env, s) -> bool:
    """Does symbol s have a finite upper bound that no guard set? Sizes start unbounded above; only a
    declared range or a guard bounds them, and the guards are on record."""
    upper = env.var_to_range[s].upper
    return upper.is_Integer and not any(g.expr == sympy.Le(s, upper) for g in env.guards)


def _guards_suppressed(env) -> bool:
    check = getattr(env, "_suppress_guards_tls", None)
    return True if check is None else bool(check())


# --- simplification -------------------------------------------------------------------------------

def _as_mod_terms(expr: Expr):
    """expr -> list of (coef, base, divisor, modulus-or-None) and a remainder (non-modular part)."""
    terms, rest = [], sympy.Integer(0)
    for t in sympy.Add.make_args(expand_index(expr)):
        coef, atoms = sympy.Integer(1), []
        for f in sympy.Mul.make_args(t):
            if isinstance(f, (FloorDiv, ModularIndexing)) or (isinstance(f, sympy.Symbol) and not _is_size_symbol(f)):
                atoms.append(f)
            else:
                coef = coef * f
        if len(atoms) != 1:
            rest = rest + t
            continue
        a = atoms[0]
        if isinstance(a, FloorDiv):
            terms.append([coef, a.args[0], a.args[1], None])
        elif isinstance(a, ModularIndexing):
            terms.append([coef, a.args[0], a.args[1], a.args[2]])
        else:
            terms.append([coef, a, sympy.Integer(1), None])
    return terms, rest


def _is_size_symbol(s: sympy.Symbol) -> bool:
    return s.name.startswith("s") or s.name.startswith("u")


def _rebuild(coef, base, div, mod) -> Expr:
    if mod is None:
        return coef * FloorDiv(base, div)
    return coef * ModularIndexing(base, div, mod)


@functools.lru_cache(maxsize=65536)
def simplify_index(expr: Expr, ranges: tuple = ()) -> Expr:
    """Merge floor/mod pieces of the same variable into fewer, wider ones. `ranges` is a tuple of
    (var, extent) pairs: ModularIndexing(v, d, m) with d*m >= extent(v) becomes FloorDiv(v, d)."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    # inside-out: the arguments of floor/mod first (views of views nest them)
    expr = expr.replace(lambda e: isinstance(e, (FloorDiv, ModularIndexing)) and e.args[0].has(FloorDiv, ModularIndexing),
                        lambda e: type(e)(simplify_index(e.args[0], ranges), *e.args[1:]))
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    extents = dict(ranges)
    if extents:
        expr = simplify_bounded(expr, ranges)
        if not expr.has(FloorDiv, ModularIndexing):
            return expr
    terms, rest = _as_mod_terms(expr)
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(terms):
            for j, b in enumerate(terms):
                if i == j or a[1] != b[1] or b[3] is None:
                    continue
                # a = ca*(v // (db*mb)) % ma , b = cb*(v // db) % mb ; merge when ca == cb*mb
                if _simplify(a[2] - b[2] * b[3]) == 0 and _simplify(a[0] - b[0] * b[3]) == 0:
                    mod = None if a[3] is None else a[3] * b[3]
                    terms[j] = [b[0], b[1], b[2], mod]
                    del terms[i]
                    changed = True
                    break
            if changed:
                break
    out = rest
    for coef, base, div, mod in terms:
        if mod is not None and base in extents and _known_ge(div * mod, extents[base]):
            mod = None
        out = out + _rebuild(coef, base, div, mod)
    return simplify_bounded(out, ranges) if extents else out


def _known_ge(a: Expr, b: Expr) -> bool:
    d = _simplify(a - b)
    return bool(d.is_nonnegative) or (d.is_Integer and int(d) >= 0)


def size_symbols(expr) -> list:
    """expr's size symbols in name order: kernels take them as arguments in the order they meet them, and a
    set's order follows the names' hashes, which change from process to process (one graph gave kernels
    whose source differed between processes)."""
    return sorted(set(_size_symbols(expr)), key=str)


@functools.lru_cache(maxsize=65536)
def free_symbols(expr) -> frozenset:
    """expr's free symbols, remembered: sympy walks the whole tree each time it is asked, and every
    inner_fn asks it of the same indices over and over."""
    return frozenset(sympy.sympify(expr).free_symbols)


@functools.lru_cache(maxsize=65536)
def _size_symbols(expr) -> frozenset:
    return frozenset(s for s in free_symbols(expr) if _is_size_symbol(s))


# -- simplification with the index variables' bounds ---------------------------------------------------

def _upper(term, maxes: dict) -> Optional[Expr]:
    """An inclusive upper bound of a non-negative index term (an integer, or an expression in the sizes),
    or None if unknown. Sizes are their own bound: they are constants while a kernel runs."""
    if term.is_Integer:
        return term if term >= 0 else None
    if term in maxes:
        return maxes[term]
    if isinstance(term, sympy.Symbol):
        return term if _is_size_symbol(term) and term.is_nonnegative else None
    if isinstance(term, ModularIndexing):
        return term.args[2] - 1
    if isinstance(term, FloorDiv):
        b, d = _upper(term.args[0], maxes), term.args[1]
        if b is None:
            return None
        if b.is_Integer and d.is_Integer:
            return sympy.Integer(int(b) // int(d))
        q = _exact_quotient(b + 1, d)
        return None if q is None else q - 1
    if term.is_Mul or term.is_Add:
        bs = [_upper(f, maxes) for f in term.args]
        if None in bs:
            return None
        return sympy.Mul(*bs) if term.is_Mul else sympy.Add(*bs)
    return None


def _known_lt(a: Expr, b: Expr) -> bool:
    """a < b for every value of the sizes (size symbols are positive)."""
    d = _simplify(b - a)
    return bool(d > 0) if d.is_Integer else bool(d.is_positive)


def _coef_and_rest(term: Expr):
    """term = coef * rest, coef the sizes and integers in it, rest the index part (1 for none)."""
    coef, rest = [], []
    for f in sympy.Mul.make_args(term):
        (coef if f.is_Integer or (isinstance(f, sympy.Symbol) and _is_size_symbol(f))
         or (f.is_Pow and isinstance(f.base, sympy.Symbol) and _is_size_symbol(f.base)) else rest).append(f)
    return sympy.Mul(*coef), sympy.Mul(*rest)


def _rank(e: Expr) -> int:
    """Order candidate divisors by size (sizes taken as large): only which is tried first depends on it."""
    return int(e.xreplace({x: sympy.Integer(1024) for x in free_symbols(e)}))


def _split_base(base, d: Expr, maxes: dict):
    """base = a*q + w with a | d and 0 <= w < a (so base // d == q // (d/a)): (q, a), or None.
    The largest such a wins; it drops the most from the floor. a and d may be expressions in the sizes:
    `(i1*s + i2) // s` is `i1` when i2 < s."""
    terms = [_coef_and_rest(t) for t in sympy.Add.make_args(base)]
    if any(not (c.is_positive or (c.is_Integer and c > 0)) for c, _ in terms):
        return None
    cands = {c for c, _ in terms if c != 1 and _is_multiple(d, c)} | {d}
    for a in sorted(cands, key=_rank, reverse=True):
        big = [(c, r) for c, r in terms if _is_multiple(c, a)]
        small = [c * r for c, r in terms if not _is_multiple(c, a)]
        if not big:
            continue
        bound = _upper(sympy.Add(*small), maxes) if small else sympy.Integer(0)
        if bound is not None and _known_lt(bound, a):
            return sympy.Add(*[_quotient(c, a) * r for c, r in big]), a
    return None


def _bounded(e, maxes: dict):
    base, d = e.args[0], e.args[1]
    top = _upper(base, maxes)
    if top is not None and _known_lt(top, d):
        return sympy.Integer(0)
    if isinstance(e, FloorDiv):
        sp = _split_base(base, d, maxes)
        return e if sp is None else FloorDiv(sp[0], _quotient(d, sp[1]))
    m = e.args[2]
    if d == 1 and top is not None and _known_lt(top, m):
        return base
    if d == 1 and m.is_Integer:
        # (a*q + w) % m == a*(q % (m/a)) + w when a | m and 0 <= w < a (a tile of a flattened dim)
        for a in sorted({int(c) for c, _ in (t.as_coeff_Mul() for t in sympy.Add.make_args(base))
                         if c.is_Integer and int(c) > 1 and int(m) % int(c) == 0}, reverse=True):
            sp = _split_base(base, sympy.Integer(a), maxes)
            if sp is not None and sp[1] == a:
                w = sympy.expand(base - a * sp[0])
                return a * ModularIndexing(sp[0], sympy.Integer(1), sympy.Integer(int(m) // a)) + w
    sp = _split_base(base, d, maxes)
    return e if sp is None else ModularIndexing(sp[0], _quotient(d, sp[1]), m)


@functools.lru_cache(maxsize=65536)
def _bounded_remembered(e, maxes_items: tuple):
    """_bounded by value: one floor or modulus recurs in many indices of a kernel (and across kernels)."""
    return _bounded(e, dict(maxes_items))


@functools.lru_cache(maxsize=65536)
def _simplify_bounded(expr, maxes_items: tuple):
    for _ in range(4):
        new = expr.replace(lambda e: isinstance(e, (FloorDiv, ModularIndexing)),
                           lambda e: _bounded_remembered(e, maxes_items))
        if new == expr:
            break
        expr = new
    return expr


def simplify_bounded(expr, ranges) -> sympy.Expr:
    """Drop floors and moduli that the loop bounds make redundant: `(256*x + r) // 32768` is
    `x // 128` when r < 256: the same element must print alike wherever a kernel touches it. `ranges` are
    (var, extent) pairs; an extent may be an expression in the sizes (`i % s` is `i` when i < s)."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    maxes = tuple((v, sympy.sympify(n) - 1) for v, n in ranges)
    return _simplify_bounded(expr, maxes)
