"""Index simplification with the kernel variables' ranges: the same element must print the same way
wherever a kernel touches it (a store and a later load then meet, and the value is forwarded)."""
import sympy

from ember.ir.symbolic import FloorDiv, ModularIndexing, simplify_index
from ember.schedule.nodes import RINDEX as r, XINDEX as x


def _same_values(a, b, ranges):
    (xv, xn), (rv, rn) = ranges
    return all(int(a.subs({xv: i, rv: j})) == int(b.subs({xv: i, rv: j})) for i in range(xn) for j in range(rn))


def test_floor_of_a_value_below_its_divisor_is_zero():
    ranges = ((x, 8), (r, 64))
    e = r + 64 * x + 64 * FloorDiv(r, 64)
    assert simplify_index(e, ranges) == r + 64 * x


def test_split_of_a_flat_index_merges_back():
    ranges = ((x, 64), (r, 32))
    e = r + 1024 * FloorDiv(r + 32 * x, 1024) + 32 * ModularIndexing(FloorDiv(r + 32 * ModularIndexing(x, 1, 32), 32), 1, 32)
    s = simplify_index(e, ranges)
    assert s == r + 32 * x
    assert _same_values(e, s, ranges)


def test_ranges_that_do_not_decide_keep_the_floor():
    ranges = ((x, 8), (r, 100))
    e = FloorDiv(r, 64) + x
    s = simplify_index(e, ranges)
    assert s.has(FloorDiv)
    assert _same_values(e, s, ranges)


def test_mod_of_a_small_value_drops_the_mod():
    ranges = ((x, 4), (r, 16))
    e = ModularIndexing(r + 16 * x, 16, 8)
    s = simplify_index(e, ranges)
    assert not s.has(ModularIndexing)
    assert _same_values(e, s, ranges)


def test_symbolic_extents_never_guess():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    e = FloorDiv(r, 64)
    assert simplify_index(e, ((x, 8), (r, s0))).has(FloorDiv)


# -- guard_le: decisions on a symbolic size, guarded with the ShapeEnv ---------------------------------------

def _graph_with(env, *symbols):
    """What guard_le reads from the graph being compiled: the example sizes and the ShapeEnv."""
    from types import SimpleNamespace
    table = getattr(env, "backed_var_to_val", None) or env.var_to_val       # torch >= 2.13, older
    return SimpleNamespace(shape_env=env, symbol_hints={s: int(table[s]) for s in symbols})


def _env_and_symbol(value, constraint=None):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    env = ShapeEnv()
    s = env.create_symbol(value, ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC, constraint_dim=constraint)
    return env, s


def _guard_le(graph, expr, limit):
    from ember import state
    from ember.ir.symbolic import guard_le
    with state.bind(state.graph, graph):
        return guard_le(expr, limit)


def test_guard_le_installs_a_guard_when_the_example_fits():
    env, s = _env_and_symbol(100)
    g = _graph_with(env, s)
    assert _guard_le(g, s, 64) is False and not env.guards          # too long: nothing to guard
    assert _guard_le(g, 2 * s, 1024) is True
    assert [str(x.expr) for x in env.guards] == ["2*%s <= 1024" % s]
    assert env.evaluate_expr(sympy.Le(s, 512)) == sympy.true        # implied now: no second guard
    assert _guard_le(g, sympy.Integer(9), 8) is False and _guard_le(g, sympy.Integer(8), 8) is True


def test_guard_le_keeps_the_looped_choice_when_it_cannot_guard():
    from torch.fx.experimental.symbolic_shapes import StrictMinMaxConstraint
    from torch.utils._sympy.value_ranges import ValueRanges
    env, s = _env_and_symbol(100)
    assert _guard_le(None, s, 1024) is False                          # no graph, no ShapeEnv
    u = env.create_unbacked_symint().node.expr
    assert _guard_le(_graph_with(env, s), u, 1024) is False           # data-dependent: no example value
    assert _guard_le(_graph_with(env, s), FloorDiv(s, 2), 1024) is False   # not a polynomial of sizes
    env.freeze()                                                       # guards would be dropped
    assert _guard_le(_graph_with(env, s), s, 1024) is False
    # a declared range that reaches above the limit: a guard would violate it
    env, s = _env_and_symbol(100, StrictMinMaxConstraint(vr=ValueRanges(2, 100000), warn_only=False))
    assert _guard_le(_graph_with(env, s), s, 1024) is False and not env.guards
    # ... one within the limit decides it with no guard
    env, s = _env_and_symbol(100, StrictMinMaxConstraint(vr=ValueRanges(2, 1000), warn_only=False))
    assert _guard_le(_graph_with(env, s), s, 1024) is True and not env.guards


def test_guard_le_may_tighten_its_own_guard():
    env, s = _env_and_symbol(100)
    g = _graph_with(env, s)
    assert _guard_le(g, s, 16384) is True
    assert _guard_le(g, s, 1024) is True                              # below the guard ember installed
    assert len(env.guards) == 2


def test_bounds_in_symbolic_sizes_simplify_views():
    """Views over symbolic sizes flatten into floors and moduli by sizes; with the loop bounds (which
    may be sizes themselves) they must fold back, so the same element prints alike in every kernel."""
    x, r = sympy.symbols("xindex rindex", integer=True, nonnegative=True)
    s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
    # (s1, s2, 64) viewed as (s1*s2, 64): x // s2 and x % s2 address the same element as 64*x + r
    e = 64 * s2 * FloorDiv(64 * x + r, 64 * s2) + ModularIndexing(r, 1, 64) + 64 * ModularIndexing(64 * x + r, 64, s2)
    assert simplify_index(e, ((x, s1 * s2), (r, 64))) == 64 * x + r
    # a softmax over a symbolic row s0 of a (4*s1, s0, s0) buffer read through a (s1, 4, s0, s0) view
    i0, i1 = FloorDiv(x, s0), ModularIndexing(x, 1, s0)
    flat = i0 * s0**2 + i1 * s0 + r
    e = 4 * s0**2 * FloorDiv(flat, 4 * s0**2) + s0**2 * ModularIndexing(flat, s0**2, 4) \
        + s0 * ModularIndexing(i1 * s0 + r, s0, s0) + ModularIndexing(r, 1, s0)
    assert simplify_index(e, ((x, 4 * s1 * s0), (r, s0))) == s0 * x + r
    # what the bounds do not decide stays
    assert simplify_index(ModularIndexing(x, 1, s0), ((x, s1),)) == ModularIndexing(x, 1, s0)
    assert simplify_index(FloorDiv(s0 * x + r, s0), ((x, s1), (r, s0 + 1))) == FloorDiv(s0 * x + r, s0)


def test_a_size_written_as_a_sum_divides_whichever_way_it_is_written():
    """ceil(s / 16) is FloorDiv(s - 1, 16) + 1; views write its multiples expanded (4*F + 4) or factored
    (4*(F + 1)), and a floor by one of a multiple of the other is exact either way."""
    x, r = sympy.symbols("xindex rindex", integer=True, nonnegative=True)
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    f = FloorDiv(s0 - 1, 16)
    assert FloorDiv(256 * (f + 1) ** 2 * x, 4 * f + 4) == sympy.expand(64 * (f + 1) * x)
    assert FloorDiv((4 * f + 4) * x + r, 4 * (f + 1)) == x + FloorDiv(r, 4 * f + 4)
    assert FloorDiv(3 * (f + 1) * x, 2 * f + 2).has(FloorDiv)            # 3/2 of an integer: not exact
    assert ModularIndexing(8 * (f + 1) * x + r, 1, 4 * f + 4) == ModularIndexing(r, 1, 4 * f + 4)


def test_contiguous_dim_is_the_variable_an_index_moves_by_one():
    from ember.schedule.tiling import _contiguous_dim
    i0, i1 = sympy.symbols("i0 i1", integer=True, nonnegative=True)
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    assert _contiguous_dim(s0 * i0 + i1, [i0, i1]) == 1
    assert _contiguous_dim(i0 + 8 * i1, [i0, i1]) == 0
    assert _contiguous_dim(2 * i0 + s0 * i1, [i0, i1]) is None
    assert _contiguous_dim(i1 + 4 * FloorDiv(i1, 16) + 64 * i0, [i0, i1]) is None     # moves by 5 at every 16th
    assert _contiguous_dim(s0 * (i0 + 1) + i1, [i0, i1]) == 1


def test_index_printer_spells_torchs_ceil_and_floor_of_a_ratio():
    # shapes of fused attention's outputs on a GPU hold CeilToInt(IntTrueDiv(s, 16)) with symbolic sizes
    import math
    import sympy
    from torch.utils._sympy.functions import CeilToInt, FloorToInt, IntTrueDiv
    from ember.codegen.kernel import print_index
    s = sympy.Symbol("s0", integer=True, positive=True)
    for expr, ref in ((CeilToInt(IntTrueDiv(s, 16)), lambda v: math.ceil(v / 16)),
                      (CeilToInt(s / 16), lambda v: math.ceil(v / 16)),
                      (FloorToInt(IntTrueDiv(s + 3, 4)) * 16, lambda v: (v + 3) // 4 * 16)):
        src = print_index(expr)
        assert [eval(src, {"s0": v}) for v in (1, 15, 16, 17, 33, 1000)] == [ref(v) for v in (1, 15, 16, 17, 33, 1000)]


def test_remembered_keys_values_by_type_and_computes_unhashable_arguments():
    from ember.ir.symbolic import Remembered
    calls = []

    def describe(*args):
        calls.append(args)
        return tuple(type(a).__name__ for a in args)

    remembered = Remembered(describe)
    assert remembered(3, (sympy.Integer(2),)) == ("int", "tuple")
    assert remembered(3, (sympy.Integer(2),)) == ("int", "tuple")
    assert len(calls) == 1                      # asked again: remembered
    # 3 == Integer(3) and 2 == 2 as dict keys, but other types: computed anew, not the int's answer
    assert remembered(sympy.Integer(3), (2,)) == ("Integer", "tuple")
    assert len(calls) == 2
    assert remembered([1], 2) == ("list", "int")    # unhashable: computed each time
    assert remembered([1], 2) == ("list", "int")
    assert len(calls) == 4


def test_torchs_sizes_enter_in_embers_integer_spelling():
    # the one quantity torch writes as FloorDiv(FloorDiv(s - 10, 5) - 2, 2) + 1 (two strided convolutions),
    # and Python's `//` on sympy values as floor(s/10) - 1, is one expression in ember; every floor and
    # modulus keeps a non-negative base, which the kernels' C division and remainder need
    import math
    import torch.utils._sympy.functions as tf
    from ember.codegen.cpp.indexing import cpp_index
    from ember.ir.symbolic import integer_form
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert integer_form(tf.FloorDiv(tf.FloorDiv(s - 10, 5) - 2, 2) + 1) == integer_form(sympy.floor(s / 10) - 1) \
        == FloorDiv(s, 10) - 1
    assert integer_form((s // 4 + 1) // 2) == integer_form(tf.FloorDiv(tf.FloorDiv(s, 4) + 1, 2))
    cases = ((tf.Mod(4 - tf.Mod(tf.FloorDiv(s, 4), 4), 4), lambda v: (4 - v // 4 % 4) % 4),   # Swin's padding
             (sympy.floor(sympy.floor(s / 4) / 2 + sympy.Rational(1, 2)), lambda v: (v // 4 + 1) // 2),
             (tf.CeilToInt(tf.IntTrueDiv(s, 16)), lambda v: math.ceil(v / 16)),
             (sympy.ceiling(s / 3) + tf.CleanDiv(6 * s, 3), lambda v: math.ceil(v / 3) + 2 * v),
             (s * (s + 1) / 2, lambda v: v * (v + 1) // 2),
             # a quotient by a quotient of sizes (Swin's Hp // (Hp // 4)): sympy cannot tell it is positive
             ((s + 3) // ((s + 3) // 4), lambda v: (v + 3) // ((v + 3) // 4)))
    for expr, ref in cases:
        e = integer_form(expr)
        assert not any(not r.is_Integer for r in e.atoms(sympy.Rational)), e
        assert all(type(f) in (FloorDiv, ModularIndexing) for f in e.atoms(sympy.Function)), e
        for v in (1, 3, 4, 15, 16, 17, 33, 1000):
            assert all(f.args[0].subs(s, v) >= 0 for f in e.atoms(FloorDiv, ModularIndexing)), (e, v)
            assert e.subs(s, v) == ref(v), (expr, e, v)
        assert "floor" not in cpp_index(e) and "ceil" not in cpp_index(e)


def test_a_view_infers_its_free_size_as_an_integer():
    # Swin's window_reverse, view(-1, Hp // w, Wp // w, w, w, C) with a symbolic window w: numel over the
    # other sizes is exact but does not cancel in sympy; printed as a true division, the wrapper computed a
    # float size from it
    from ember.codegen.kernel import print_index
    from ember.lowering.views import _infer_size
    b, h, c = (sympy.Symbol(n, integer=True, positive=True) for n in ("b", "h", "c"))
    w = FloorDiv(h + 1, 2)
    hp = h + ModularIndexing(w - ModularIndexing(h, 1, w), 1, w)
    size = _infer_size([-1, FloorDiv(hp, w), FloorDiv(hp, w), w, w, c], b * hp * hp * c)
    assert all("/" not in print_index(s).replace("//", "") for s in size)
    for bv, hv in ((2, 5), (3, 8), (1, 13)):
        wv = (hv + 1) // 2
        hpv = hv + (wv - hv % wv) % wv
        assert size[0].subs({b: bv, h: hv}) == bv * hpv * hpv // ((hpv // wv) ** 2 * wv * wv)


def test_a_size_scaled_by_a_float_is_an_integer_where_the_float_product_is_exact():
    """torch writes a resize's scaled size as TruncToInt(scale * ToFloat(s)): with a scale of few significant
    bits it is the floor of an exact fraction, equal to Python's float product rounded down; with 1.7 it
    stays as torch wrote it (float(10) * 1.7 is 17.0, the fraction of the float nearest 1.7 times 10 is below
    17)."""
    import math
    import torch.utils._sympy.functions as tf
    from ember.codegen.cpp.indexing import cpp_index
    from ember.ir.symbolic import exact_fraction, integer_form
    s = sympy.Symbol("s0", integer=True, positive=True)
    for scale in (1.5, 0.5, 2.0, 1.25, 0.375):
        e = integer_form(tf.TruncToInt(sympy.Float(scale) * tf.ToFloat(s)))
        assert not e.atoms(sympy.Float) and "floor" not in cpp_index(e), e
        for v in (1, 2, 5, 7, 10, 33, 1001, 2**30 - 1):
            assert e.subs(s, v) == math.trunc(float(v) * scale), (scale, v)
    assert exact_fraction(sympy.Float(1.7) * s) is None
    assert math.trunc(float(10) * 1.7) == 17 and math.floor(sympy.Rational(1.7) * 10) == 16
    assert integer_form(tf.TruncToInt(sympy.Float(1.7) * tf.ToFloat(s))).atoms(sympy.Float)


def test_divisibility_checked_at_sample_values_before_a_gcd():
    """symbolic._divides_at_samples: a quick no before sympy.cancel, never a wrong one. Multiples (for every
    value of the sizes) divide at the samples; a term that does not divide there is no multiple."""
    import sympy
    from ember.ir import symbolic
    from ember.ir.symbolic import FloorDiv, ModularIndexing
    s0, s1, x = sympy.symbols("s0 s1 x0", integer=True, positive=True)
    multiples = [(s0 * s1 + s0, s0), (4 * FloorDiv(s0 - 1, 4) + 4, 4), ((s0 + 1) * (s1 + 2), s1 + 2),
                 (s0 ** 2 - s1 ** 2, s0 + s1), (6 * ModularIndexing(x, 1, s0) * s1, 3 * s1)]
    for term, divisor in multiples:
        assert symbolic._divides_at_samples(term, divisor)
        assert symbolic._exact_quotient(term, divisor) is not None, (term, divisor)
    for term, divisor in [(s0 + 1, s0), (s0 * s1 + 1, s1), (FloorDiv(s0, 2), 2), (x + s0, s0 + 1)]:
        assert not symbolic._divides_at_samples(term, divisor)
        assert symbolic._exact_quotient(term, divisor) is None
