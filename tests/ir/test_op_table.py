"""The op table (ember/ir/op_table.py) against the ops protocol, against eager's dtype rules, and every op in it
run by every kernel backend against eager; the reduction steps (ember/codegen/reduction_steps.py) evaluated
on tensors against eager's statistics.

Each backend test compiles one function that applies every op to fresh random inputs of each dtype it
applies to (one graph, so the Triton interpreter and the C++ compiler run once), and checks that the
lowerings really emitted each IR op and that no ATen fallback ran.
"""
import functools

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.codegen import reduction_steps as steps
from ember.graph.custom_ops import softmax_stats
from ember.ir import ops as ir_ops
from ember.ir.op_table import (BOOL, CAST, FLOAT, MATH_OPS, PROMOTE, REDUCTIONS, SAME, SCANS, one_element_reduction,
                               promote)
from ember.ir.ops import BINARY, OP_NAMES, REDUCTION_TYPES, SCAN_COMBINES, TUPLE_REDUCTIONS, UNARY, ops
from ember.lowering.pointwise import pointwise
from ember.lowering.registry import lower
from ember.testing import assert_close, randb, randf, randi

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
I32, I64, I8, BOOLT = torch.int32, torch.int64, torch.int8, torch.bool
FLOATS, INTS = (F32, F64, F16, BF16), (I32, I64, I8)
INF, NAN = float("inf"), float("nan")


# --- the table covers the protocol -------------------------------------------------------------------------

def test_table_covers_every_math_op_and_reduction():
    assert set(MATH_OPS) == set(UNARY) | set(BINARY) | {"where", "to_dtype", "constant"}
    assert set(MATH_OPS) <= set(OP_NAMES)
    arity = {**{n: 1 for n in UNARY}, **{n: 2 for n in BINARY}, "where": 3, "to_dtype": 1, "constant": 0}
    for name, op in MATH_OPS.items():
        assert op.name == name and op.arity == arity[name]
        assert op.result in (SAME, PROMOTE, FLOAT, BOOL, CAST)
    assert tuple(REDUCTIONS) == REDUCTION_TYPES
    for name, red in REDUCTIONS.items():
        assert red.arity == TUPLE_REDUCTIONS.get(name, 1)
        assert red.combine is None or (red.combine in BINARY and MATH_OPS[red.combine].arity == 2)
    assert tuple(SCANS) == SCAN_COMBINES


def test_reduction_identities_leave_a_combine_unchanged():
    for name, red in REDUCTIONS.items():
        if red.combine is None:
            continue
        fn = {"add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
              "logical_or": torch.logical_or, "logical_and": torch.logical_and}[red.combine]
        dtypes = (BOOLT,) if name in ("any", "all") else (F32, F64, I32, I64, I8)
        for dt in dtypes:
            x = (randb(50) if dt == BOOLT else randi(50, dtype=dt) if not dt.is_floating_point else
                 torch.cat([randf(47, dtype=dt), torch.tensor([INF, -INF, NAN], dtype=dt)]))
            ident = torch.full_like(x, red.identity(dt))
            torch.testing.assert_close(fn(ident, x), x, equal_nan=True, rtol=0, atol=0, msg=f"{name} {dt}")


# --- result dtypes against eager's ------------------------------------------------------------------------

# the eager function of each IR op
EAGER = {**{n: getattr(torch, n) for n in UNARY},
         **{n: getattr(torch, {"truediv": "true_divide", "floordiv": "floor_divide"}.get(n, n)) for n in BINARY}}
# unary ops a lowering applies to bool values (others cast them first: square of bool is pow's int64)
BOOL_UNARY = {"logical_not", "bitwise_not", "abs", "sign", "signbit", "isnan", "isinf"}
# binary ops on floats only (lowerings refuse integer pow; eager has no integer hypot)
FLOAT_ONLY = {"pow", "hypot"}


def test_result_dtypes_match_eager():
    dtypes = (F32, F64, F16, I32, I64, I8, BOOLT)
    for name in UNARY:
        for dt in dtypes:
            if dt == BOOLT and name not in BOOL_UNARY:
                continue
            try:
                expected = EAGER[name](torch.ones(2, dtype=dt)).dtype
            except (RuntimeError, TypeError):
                continue
            assert MATH_OPS[name].result_dtype([dt]) == expected, (name, dt)
    for name in BINARY:
        # a Python scalar operand is a literal of its default dtype
        for a in dtypes:
            for b, scalar in [(b, None) for b in dtypes] + [(I64, 3), (F32, 2.5), (BOOLT, True)]:
                if name in FLOAT_ONLY and not (a.is_floating_point or b.is_floating_point):
                    continue
                try:
                    expected = EAGER[name](torch.ones(2, dtype=a), torch.ones(2, dtype=b) if scalar is None else scalar)
                except (RuntimeError, TypeError):
                    continue
                got = MATH_OPS[name].result_dtype([a, b], [False, scalar is not None])
                assert got == expected.dtype, (name, a, b, scalar)
    for a in dtypes:
        for b in dtypes:
            expected = torch.where(torch.ones(2, dtype=BOOLT), torch.ones(2, dtype=a), torch.ones(2, dtype=b)).dtype
            assert MATH_OPS["where"].result_dtype([BOOLT, a, b]) == expected


def test_a_literal_widens_only_to_a_higher_category():
    assert promote([I8, I64], [False, True]) == I8
    assert promote([I32, F32], [False, True]) == F32
    assert promote([F16, F64], [False, True]) == F16
    assert promote([BOOLT, I64], [False, True]) == I64
    assert promote([I32, I64], [False, False]) == I64
    assert promote([F32, F64], [True, True]) == F64


# --- every op on every backend --------------------------------------------------------------------------

# inputs by kind, one set per dtype shared by every op (so that the ops of a dtype fuse into few kernels):
# "a", "b" over [-3, 3) (integers over [-20, 20)) starting with special values, "nz" a divisor without 0 (and,
# for integers, without -1: INT_MIN // -1 traps), the others ranges of floats, "shift" shift amounts
_SPECIAL_FLOATS = [INF, -INF, NAN, 0.0, -0.0, 2.5, -0.5, 1.0]
_RANGES = {"pos": (0.05, 5.0), "unit": (-0.99, 0.99), "ge1": (1.0, 5.0), "log1p": (-0.9, 4.0), "base": (0.1, 3.0),
           "expo": (-2.0, 2.0)}
N = 24


def _input(kind, dt, device):
    if dt == BOOLT:
        return randb(N, device=device)
    if not dt.is_floating_point:
        if kind == "shift":
            return randi(N, lo=-2, hi=12, dtype=dt, device=device)
        x = randi(N, dtype=dt, device=device, nonzero=kind == "nz")
        if kind == "nz":
            return torch.where(x == -1, torch.full_like(x, -2), x)
        info = torch.iinfo(dt)
        x[:4] = torch.tensor([0, -1, info.min, info.max], dtype=dt)
        return x
    lo, hi = _RANGES.get(kind, (-3.0, 3.0))
    x = randf(N, lo=lo, hi=hi, dtype=dt, device=device)
    if kind in ("a", "b"):
        x[:len(_SPECIAL_FLOATS)] = torch.tensor(_SPECIAL_FLOATS, dtype=dt)
    return x


_TO = {F32: F16, F16: F32, BF16: F64, F64: F32, I32: F32, I64: BF16, I8: I32, BOOLT: F32}


def _op_cases():
    """(IR op, eager fn, dtypes, input kind of each argument)"""
    t = torch
    cases = []

    def add(name, fn, dtypes, *kinds):
        cases.append((name, fn, dtypes, kinds or ("a",)))

    for n in "neg abs sign relu signbit".split():
        add(n, getattr(t, n), FLOATS + INTS)
    add("square", _ir_square(), FLOATS + INTS)
    for n in "exp exp2 expm1 sin cos tan atan sinh cosh tanh asinh erf erfc sigmoid".split():
        add(n, getattr(t, n), FLOATS)
    for n in "log log2 log10 sqrt rsqrt lgamma".split():
        add(n, getattr(t, n), FLOATS, "pos")
    add("log1p", t.log1p, FLOATS, "log1p")
    for n in "asin acos atanh erfinv".split():
        add(n, getattr(t, n), FLOATS, "unit")
    add("acosh", t.acosh, FLOATS, "ge1")
    for n in "floor ceil trunc round reciprocal isnan isinf".split():
        add(n, getattr(t, n), FLOATS)
    add("logical_not", t.logical_not, FLOATS + INTS + (BOOLT,))
    add("bitwise_not", t.bitwise_not, INTS)

    for n in "add sub mul".split():
        add(n, getattr(t, n), FLOATS + INTS, "a", "b")
    add("truediv", t.true_divide, FLOATS + INTS, "a", "nz")
    add("floordiv", t.floor_divide, INTS, "a", "nz")
    add("remainder", t.remainder, FLOATS + INTS, "a", "nz")
    add("fmod", t.fmod, FLOATS + INTS, "a", "nz")
    add("pow", t.pow, FLOATS, "base", "expo")
    for n in "maximum minimum eq ne lt le gt ge logical_and logical_or logical_xor".split():
        add(n, getattr(t, n), FLOATS + INTS + (BOOLT,), "a", "b")
    for n in "atan2 hypot copysign".split():
        add(n, getattr(t, n), FLOATS, "a", "b")
    for n in "bitwise_and bitwise_or bitwise_xor".split():
        add(n, getattr(t, n), INTS + (BOOLT,), "a", "b")
    for n in "bitwise_left_shift bitwise_right_shift".split():
        add(n, getattr(t, n), INTS, "a", "shift")
    add("where", lambda c, a, b: t.where(c > 0, a, b), FLOATS + INTS + (BOOLT,), "nz", "a", "b")
    add("to_dtype", lambda a: a.to(_TO[a.dtype]), FLOATS + INTS + (BOOLT,))
    add("to_dtype", lambda a: a.to(I32), (F32, F64, F16), "nz")
    # literals as Python scalars: an integer one keeps int8, a float one makes integers float
    add("constant", lambda a: (a + 2, a * 0.5, a > 1.5, t.full_like(a, 3)), FLOATS + INTS + (BOOLT,))
    return cases


@functools.lru_cache(None)
def _ir_square():
    """A test op lowered to IR square: aten.square decomposes (to a multiplication) before lowering."""
    @torch.library.custom_op("ember_op_table_test::square", mutates_args=())
    def square(x: torch.Tensor) -> torch.Tensor:
        return x * x

    @square.register_fake
    def _(x):
        return torch.empty_like(x)

    lower(torch.ops.ember_op_table_test.square)(lambda x: pointwise(ops.square, x))
    return square


@pytest.fixture
def emitted(monkeypatch):
    """The IR op names lowerings call (ops.<name>), and the reduction types of ops.reduction."""
    names = set()
    dispatch = ir_ops._Ops.__getattr__

    def record(self, name):
        names.add(name)
        fn = dispatch(self, name)
        if name == "reduction":
            def reduction(dtype, src_dtype, rtype, value):
                names.add(f"reduction:{rtype}")
                return fn(dtype, src_dtype, rtype, value)
            return reduction
        return fn
    monkeypatch.setattr(ir_ops._Ops, "__getattr__", record)
    return names


BACKENDS = ["cpp", "triton"]


def _compiled(fn, args) -> list:
    """The outputs of fn(*args) (flattened) as ember computes them: the function's ATen graph (make_fx)
    through ember.compile_graph, with the same decompositions, lowerings and kernels as torch.compile,
    without Dynamo, whose tracing of a function of hundreds of ops takes most of the time."""
    gm = make_fx(lambda *a: tuple(pytree.tree_leaves(fn(*a))))(*args)     # a graph's outputs are flat
    return list(ember.compile_graph(gm, list(args))([a.clone() for a in args]))


def _run_backend(backend, device):
    if device != "cpu" and backend == "cpp":
        pytest.skip("the C++ backend runs CPU tensors; on a GPU both runs are Triton's")
    return ember.config.patch(cpu_backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_on_every_backend(device, backend, emitted):
    cases, args, where = [], [], {}
    for name, fn, dtypes, kinds in _op_cases():
        for dt in dtypes:
            for k in kinds:
                if (k, dt) not in where:
                    where[k, dt] = len(args)
                    args.append(_input(k, dt, device))
            cases.append((name, dt, fn, [where[k, dt] for k in kinds]))

    def every_op(*a):
        return tuple(fn(*(a[i] for i in at)) for _, _, fn, at in cases)

    expected = every_op(*args)
    with _run_backend(backend, device):
        actual = iter(_compiled(every_op, args))
    assert not ember.metrics.fallbacks, f"ATen fallbacks: {dict(ember.metrics.fallbacks)}"
    for (name, dt, _, _), e in zip(cases, expected):
        e = pytree.tree_leaves(e)
        assert_close([next(actual) for _ in e], e, what=f"{name} of {dt}")
    missing = set(MATH_OPS) - emitted
    assert not missing, f"lowerings emitted no {sorted(missing)}"


def _rows(device, n):
    """Rows of random values: one whose max is its last value, one with a nan and one with +inf near the
    end (in a looped kernel's last chunk), one with -inf at every third value, one of only -inf."""
    x = randf(6, n, device=device)
    x[0, -1] = 5.0
    x[1, -2] = NAN
    x[2, -2] = INF
    x[3, ::3] = -INF
    x[4] = -INF
    return x


def _every_reduction(x, xi, b):
    # a bool amin is the IR's "all" (aten.all decomposes to any); ember::softmax_stats is online_softmax, which
    # softmax becomes only where the backend reads rows online. var_mean of rows without infinities: eager's
    # mean of a row holding one is inf or nan by where its Welford steps meet it, a two-pass mean is inf
    finite = torch.where(x.isinf(), 0.5, x)
    return (x.sum(-1), (x * 0.001 + 1.0).prod(-1), x.amax(-1), x.amin(-1), (x > 1).any(-1), (x > -2.5).all(-1),
            b.any(-1), b.amin(-1), x.argmax(-1), x.argmin(-1), torch.var_mean(finite, -1), torch.softmax(x, -1),
            torch.log_softmax(x, -1), softmax_stats(x, -1),
            xi.sum(-1), xi.prod(-1), xi.amax(-1), xi.amin(-1), xi.argmax(-1), xi.argmin(-1),
            x.cumsum(-1), x.cumprod(-1), torch.logcumsumexp(x, -1), xi.cumsum(-1))


def _looped_reductions(x, xi, b):
    """The reductions whose state a loop over a row's chunks carries, each of its own kind."""
    return (x.sum(-1), x.amax(-1), x.argmin(-1), b.amin(-1), xi.prod(-1), torch.var_mean(torch.where(x.isinf(), 0.5, x), -1),
            softmax_stats(x, -1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", ["short", "long", "strided"])
def test_every_reduction_on_every_backend(device, backend, rows, emitted):
    """Rows the Triton kernel holds whole (short), or loops over in chunks (long: the persistent limit is
    below them, and a strided row of 300 is two chunks, its special values in the last), and the C++
    kernel's row lanes (long: 64 lanes) and x-lanes (strided: a reduction along the outer dim)."""
    n, strided = {"short": (19, False), "strided": (40, True),
                  "long": (300, True) if backend == "triton" else (1100, False)}[rows]
    x = _rows(device, n)
    xi = randi(6, n, lo=-3, hi=4, device=device)
    b = randb(6, n, device=device)
    if strided:
        x, xi, b = x.t().contiguous().t(), xi.t().contiguous().t(), b.t().contiguous().t()
    fn = _looped_reductions if rows == "long" else _every_reduction
    with _run_backend(backend, device), ember.config.patch(persistent_reduction_max=64):
        actual = _compiled(fn, [x, xi, b])
    assert_close(actual, pytree.tree_leaves(fn(x, xi, b)))
    assert not ember.metrics.fallbacks, f"ATen fallbacks: {dict(ember.metrics.fallbacks)}"
    if rows == "short":
        assert {f"reduction:{r}" for r in REDUCTION_TYPES} <= emitted


# --- the reduction steps and the one-element case on tensors -------------------------------------------

class TensorExprs:
    """reduction_steps' expression builder over float64 tensors."""
    add, sub, mul, truediv, neg, abs, exp = torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.abs, torch.exp
    eq, ne, gt, logical_or, where, maximum = torch.eq, torch.ne, torch.gt, torch.logical_or, torch.where, torch.maximum

    def let(self, expr, hint):
        return expr

    def constant(self, value):
        return torch.tensor(value, dtype=F64)


def _stat_rows():
    x = randf(6, 53, dtype=F64)
    x[1, 7] = NAN
    x[2, 11] = INF
    x[3, ::2] = -INF
    x[4] = -INF
    x[5, 3] = -INF
    return x


LANES = 8


def _merge(combine, parts):
    while len(parts) > 1:
        parts = [combine(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def test_welford_steps_give_eagers_mean_and_m2():
    b, x = TensorExprs(), _stat_rows()
    state = [tuple(torch.full((x.shape[0],), v, dtype=F64) for v in REDUCTIONS["welford"].identity(F64))
             for _ in range(LANES)]
    for j in range(x.shape[1]):
        lane = state[j % LANES]
        state[j % LANES] = steps.welford_update(b, *lane, x[:, j], steps.welford_reciprocal(b, lane[2]))
    mean, m2, w = _merge(lambda p, q: steps.welford_combine(b, p, q), state)
    var, emean = torch.var_mean(x, -1, correction=0)
    torch.testing.assert_close(mean, emean, equal_nan=True)
    torch.testing.assert_close(m2, var * x.shape[1], equal_nan=True)
    assert torch.equal(w, torch.full_like(w, x.shape[1]))


def _eager_softmax_stats(x):
    m = x.amax(-1)
    return m, torch.exp(x - m[:, None]).sum(-1)


def test_softmax_stats_lane_steps_give_eagers_max_and_sum():
    b, x = TensorExprs(), _stat_rows()
    m0, s0 = REDUCTIONS["online_softmax"].identity(F64)
    state = [(torch.full((x.shape[0],), m0, dtype=F64), torch.full((x.shape[0],), s0, dtype=F64))] * LANES
    for j in range(x.shape[1]):
        state[j % LANES] = steps.softmax_stats_lane_step(b, *state[j % LANES], x[:, j])
    m, s = steps.softmax_stats_finish(b, *_merge(lambda p, q: steps.softmax_stats_combine(b, p, q), state))
    em, es = _eager_softmax_stats(x)
    torch.testing.assert_close(m, em, equal_nan=True)
    torch.testing.assert_close(s, es, equal_nan=True)


def test_softmax_stats_shared_max_steps_give_eagers_max_and_sum():
    b, x = TensorExprs(), _stat_rows()
    m0, s0 = REDUCTIONS["online_softmax"].identity(F64)
    m = torch.full((x.shape[0], 1), m0, dtype=F64)
    s = torch.full((x.shape[0], LANES), s0, dtype=F64)
    for j in range(0, x.shape[1], LANES):
        v = torch.full((x.shape[0], LANES), m0, dtype=F64)          # lanes past the row hold max's identity
        block = x[:, j:j + LANES]
        v[:, :block.shape[1]] = block
        block_max = torch.stack([torch.max(r) for r in v])[:, None]  # nan-propagating, as the kernels' max
        m, s = steps.softmax_stats_shared_max_step(b, m, s, v, block_max)
    m, s = steps.softmax_stats_finish(b, m[:, 0], s.sum(-1))
    em, es = _eager_softmax_stats(x)
    torch.testing.assert_close(m, em, equal_nan=True)
    torch.testing.assert_close(s, es, equal_nan=True)


class TensorOps:
    """An ops handler over tensors, for one_element_reduction."""

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype)

    def to_dtype(self, x, dtype, src_dtype=None):
        return x.to(dtype)

    sub, mul, exp = torch.sub, torch.mul, torch.exp


def test_one_element_reductions_match_eager():
    o = TensorOps()
    x = torch.tensor([[1.5], [-2.0], [0.0], [INF], [-INF], [NAN]], dtype=F32)
    v = x[:, 0]
    single = lambda r, dt=F32: one_element_reduction(o, r, v, dt)      # noqa: E731
    var, mean = torch.var_mean(x, -1, correction=0)
    got = single("welford")
    torch.testing.assert_close(got[0], mean, equal_nan=True)
    torch.testing.assert_close(got[1], var, equal_nan=True)
    assert torch.equal(got[2], torch.tensor(1.0))
    em, es = _eager_softmax_stats(x)
    torch.testing.assert_close(single("online_softmax"), (em, es), equal_nan=True)
    for r, eager in (("sum", x.sum(-1)), ("prod", x.prod(-1)), ("max", x.amax(-1)), ("min", x.amin(-1)),
                     ("any", x.any(-1)), ("all", x.all(-1))):
        torch.testing.assert_close(single(r, eager.dtype), eager, equal_nan=True)
    for r in ("argmax", "argmin"):
        assert int(single(r)) == 0 and int(getattr(x, r)(-1).max()) == 0
