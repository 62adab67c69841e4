"""The arithmetic of the reductions whose step is more than one op: Welford's (mean, m2, weight) and
softmax's statistics (max, sum of exp(v - max)), written once and rendered by each kernel backend in its
own syntax. The starting values are the op table's (ir/op_table.REDUCTIONS[...].identity).

Each function takes an expression builder `b` (codegen/triton/spelling.TritonExprs,
codegen/cpp/spelling.CppExprs) and expressions of its language, and returns expressions. A builder has
the IR ops the steps use, each taking and returning expressions: add sub mul truediv neg abs exp eq ne gt
logical_or where, and maximum, where a NaN operand wins; `constant(value)`, a float literal; and
`let(expr, hint)`, which binds `expr` to a new name (a statement of the builder's) and returns the name.
Every state a step returns is such a name, so the caller may assign the results in any order.

How the steps run is the backend's: which lanes hold partial states, how a lane past the row is masked
(Triton keeps the old state with tl.where, or feeds the identity; C++ loops run only over the row), and how
the partial states of a row are merged at the end (Triton: tl.reduce with helpers.welford_combine; C++:
the prelude's welford_lanes and softmax_stats_lanes, which merge with SIMD shuffles) -- the merges
compute `welford_combine` and `softmax_stats_combine` below.

Eager's values for odd rows, which every strategy keeps: a -inf element adds nothing to softmax's sum,
+inf or nan make the sum nan (and nan the max), and a row of only -inf gets a nan sum (exp(-inf - -inf)).
"""
from __future__ import annotations

INF = float("inf")


class ExprBuilder:
    """What the backends' builders share: binary ops spelled `(a op b)` from `infix` (IR op name -> the
    language's operator), and `let` appending `statement` (a format of name and expr) to `lines`, the name
    being `prefix_hint`."""
    infix: dict = {}
    statement = "{name} = {expr}"

    def __init__(self, prefix: str):
        self.prefix, self.lines = prefix, []

    def let(self, expr: str, hint: str) -> str:
        name = f"{self.prefix}_{hint}"
        self.lines.append(self.statement.format(name=name, expr=expr))
        return name

    def __getattr__(self, name):
        if name in self.infix:
            return lambda a, b: f"({a} {self.infix[name]} {b})"
        raise AttributeError(name)


# -- Welford: a row's (mean, m2 = sum of squared deviations, weight = count) --------------------------------

def welford_reciprocal(b, weight):
    """1 / (weight + 1): the step's factor for a state that has seen `weight` values. A caller whose lanes
    have all seen the same count computes it once for all of them (C++: once per chunk of the row)."""
    return b.let(b.truediv(b.constant(1.0), b.add(weight, b.constant(1.0))), "inv")


def welford_update(b, mean, m2, weight, v, reciprocal):
    """One value `v` into the state: weight' = weight + 1, d = v - mean, mean' = mean + d / weight' (as d
    times `reciprocal`, welford_reciprocal(weight)), m2' = m2 + d * (v - mean')."""
    d = b.let(b.sub(v, mean), "d")
    mean_n = b.let(b.add(mean, b.mul(d, reciprocal)), "mn")
    m2_n = b.let(b.add(m2, b.mul(d, b.sub(v, mean_n))), "m2n")
    return mean_n, m2_n, b.let(b.add(weight, b.constant(1.0)), "wn")


def welford_combine(b, a, c):
    """Two partial states (mean, m2, weight) merged (Chan et al.): with n = wa + wc, delta = mean_c -
    mean_a and frac = wc / n (0 for two empty states), mean = mean_a + delta * frac and m2 = m2_a + m2_c
    + delta^2 * wa * frac."""
    (mean_a, m2_a, w_a), (mean_c, m2_c, w_c) = a, c
    n = b.let(b.add(w_a, w_c), "n")
    delta = b.let(b.sub(mean_c, mean_a), "delta")
    zero = b.constant(0.0)
    frac = b.let(b.where(b.eq(n, zero), zero, b.truediv(w_c, b.where(b.eq(n, zero), b.constant(1.0), n))), "frac")
    mean = b.let(b.add(mean_a, b.mul(delta, frac)), "cm")
    m2 = b.let(b.add(b.add(m2_a, m2_c), b.mul(b.mul(b.mul(delta, delta), w_a), frac)), "cm2")
    return mean, m2, n


# -- softmax statistics: a row's (max, sum of exp(v - max)) ---------------------------------------------

def softmax_stats_lane_step(b, m, s, v):
    """One value `v` into a lane's own (max, sum), one exp per value: exp(-|v - max|) is the new term
    where the max holds, and the old sum's scale where v becomes the max (the new term is then 1, or nan
    for an inf or nan v). A -inf value leaves the state as it is."""
    grows = b.let(b.logical_or(b.gt(v, m), b.ne(v, v)), "gt")
    e = b.let(b.exp(b.neg(b.abs(b.sub(v, m)))), "e")
    one = b.add(b.sub(v, v), b.constant(1.0))
    s_n = b.let(b.where(grows, b.add(b.mul(s, e), one), b.add(s, e)), "sn")
    s_n = b.let(b.where(b.eq(v, b.constant(-INF)), s, s_n), "sk")
    return b.let(b.where(grows, v, m), "mx"), s_n


def softmax_stats_shared_max_step(b, m, s, v, block_max):
    """A block of values `v` into a row's state whose lanes share one max `m` and each keep a sum `s`:
    `block_max` is the block's max of v (lanes past the row hold -inf). The sums are rescaled once if the
    max grew (the scale is 1 while it holds, -inf to -inf included) and each adds exp(v - max), so the
    lanes' sums merge by a plain sum. While the max is still -inf every v is -inf too, and its term is
    exp(v - 0) = 0 where exp(v - max) would be nan."""
    mn = b.let(b.maximum(m, block_max), "mn")
    scale = b.let(b.where(b.eq(m, mn), b.constant(1.0), b.exp(b.sub(m, mn))), "sc")
    shift = b.where(b.eq(mn, b.constant(-INF)), b.constant(0.0), mn)
    return mn, b.let(b.add(b.mul(s, scale), b.exp(b.sub(v, shift))), "sn")


def softmax_stats_combine(b, a, c):
    """Two partial states (max, sum) merged: each sum rescaled to the common max; an empty part (sum 0:
    no value, or only -inf ones) adds nothing, also where both maxima are -inf."""
    (m_a, s_a), (m_c, s_c) = a, c
    mx = b.let(b.maximum(m_a, m_c), "cmx")
    zero = b.constant(0.0)
    ea = b.where(b.eq(s_a, zero), zero, b.mul(s_a, b.exp(b.sub(m_a, mx))))
    ec = b.where(b.eq(s_c, zero), zero, b.mul(s_c, b.exp(b.sub(m_c, mx))))
    return mx, b.let(b.add(ea, ec), "cs")


def softmax_stats_finish(b, m, s):
    """The row's (max, sum) from its merged state: a row of only -inf gets a nan sum, as eager's
    exp(-inf - -inf) does. Returns expressions, not names."""
    return m, b.where(b.eq(m, b.constant(-INF)), b.constant(float("nan")), s)
