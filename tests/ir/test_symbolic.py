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
