"""Collectives in the Wrapper IR, in this process with a one-rank gloo group (the values of a one-rank
collective are known; tests/distributed/test_collectives.py runs 2 ranks): each collective is an issue
call and a wait call carrying a Collective, no memory a collective writes or reads is freed or reused
before its wait, and the overlap pass issues early and waits late."""
import pytest
import torch
import torch.distributed as dist

import ember
from ember.codegen import program as program_module
from ember.codegen.wrapper.fx import FxRenderer, launch_kernel
from ember.codegen.wrapper.lines import CallExtern, CallKernel, Free, Reuse
from ember.testing import assert_close

from spawn_ranks import requires_gloo

pytestmark = requires_gloo
c10d = torch.ops._c10d_functional if dist.is_available() else None


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def programs(monkeypatch):
    """The WrapperPrograms the compiles below build, in order."""
    built = []
    build = program_module.ProgramBuilder.build

    def record(self):
        built.append(build(self))
        return built[-1]
    monkeypatch.setattr(program_module.ProgramBuilder, "build", record)
    return built


def _group():
    return dist.group.WORLD.group_name


def _collectives(x, y):
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    a = fc.all_reduce(x * 2, "sum", group)
    b = fc.all_gather_tensor(y + 1, 0, group)
    c = fc.reduce_scatter_tensor(x.relu(), "sum", 0, group)
    d = fc.all_to_all_single(y * 3, None, None, group)
    return a.sin() + 1, b * 2, c - 1, d.exp() + a.sum()


def test_collectives_compute_eagers_values():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    expected = _collectives(x, y)
    assert_close(torch.compile(_collectives, backend="ember")(x, y), expected)
    assert ember.metrics.eager_fallbacks == 0
    assert not [op for op in ember.metrics.fallbacks if "c10d" in op], ember.metrics.fallbacks
    assert ember.metrics.collectives[str(c10d.wait_tensor.default)] == 4


def _position(lines, pred) -> int:
    return next(i for i, ln in enumerate(lines) if pred(ln))


def test_issue_and_wait_lines_keep_memory_until_the_wait(programs):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.compile(_collectives, backend="ember")(x, y)
    (program,) = programs
    lines = program.lines
    issues = [ln for ln in lines if isinstance(ln, CallExtern) and ln.collective and ln.collective.kind == "issue"]
    waits = [ln for ln in lines if isinstance(ln, CallExtern) and ln.collective and ln.collective.kind == "wait"]
    assert len(issues) == 4 and len(waits) == 4
    assert all(ln.collective.group == _group() for ln in issues)
    # issued in the program's order on every rank; x * 2 dies with its all-reduce: reduced in place
    assert [ln.op for ln in issues] == [c10d.all_reduce_.default, c10d.all_gather_into_tensor.default,
                                        c10d.reduce_scatter_tensor.default, c10d.all_to_all_single.default]
    for issue in issues:
        (wait,) = [w for w in waits if w.collective.issued_by == issue.name]
        # `x = wait_tensor(x)`: the wait returns the tensor it waits on, the one an in-place collective writes
        written = issue.args[0] if issue.op == c10d.all_reduce_.default else issue.name
        assert wait.name == written and [str(a) for a in wait.args] == [written]
        start, end = lines.index(issue), lines.index(wait)
        inputs = {str(a) for a in issue.args if isinstance(a, str)}
        held = inputs | {written}     # an in-place issue's own name is a second name for its input
        for ln in lines[start + 1:end]:
            assert not (isinstance(ln, Free) and held & set(ln.names)), (issue.name, ln)
            assert not (isinstance(ln, Reuse) and ln.old in held), (issue.name, ln)
            assert not (isinstance(ln, CallKernel) and held & {str(a) for a in ln.args}), (issue.name, ln)


def _independent_work(x, y):
    a = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", _group()))
    d = torch.mm(y, y).sin()
    return a + 1, d


def _independent_work_first(x, y):
    d = torch.mm(y, y).sin()
    a = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", _group()))
    return a + 1, d


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("fn", [_independent_work, _independent_work_first])
def test_overlap_issues_early_and_waits_late(programs, fn, overlap):
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    expected = fn(x, y)
    with ember.config.patch(overlap_collectives=overlap):
        assert_close(torch.compile(fn, backend="ember")(x, y), expected)
    lines = programs[0].lines
    issue = _position(lines, lambda ln: isinstance(ln, CallExtern) and ln.op == c10d.all_reduce_.default)
    wait = _position(lines, lambda ln: isinstance(ln, CallExtern) and ln.op == c10d.wait_tensor.default)
    mm = _position(lines, lambda ln: isinstance(ln, CallExtern) and ln.op == torch.ops.aten.mm.default)
    if overlap:     # the collective's input is computed first, the product while the collective runs
        assert issue < mm < wait
    elif fn is _independent_work:       # as traced
        assert issue < wait < mm
    else:
        assert mm < issue < wait


def test_fx_wrapper_carries_the_collectives(programs):
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    expected = _independent_work(x, y)
    with ember.config.patch(wrapper="fx"):
        assert_close(torch.compile(_independent_work, backend="ember")(x, y), expected)
    gm = FxRenderer(programs[0], programs[0].load_kernels()).render()
    marked = {n.target: n.meta["ember_collective"].kind for n in gm.graph.nodes if "ember_collective" in n.meta}
    assert marked == {c10d.all_reduce_.default: "issue", c10d.wait_tensor.default: "wait"}
    wait = next(n for n in gm.graph.nodes if n.target == c10d.wait_tensor.default)
    # the kernel that reads the waited value takes the wait's node
    assert any(u.target is launch_kernel for u in wait.users)


def test_in_place_collective_returns_the_buffer_it_writes():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        out = c10d.wait_tensor(c10d.all_reduce_(w, "sum", _group()))
        return out + x, (out * 2).cos()

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w.clone())
    expected = f(x, w.clone())
    compiled = ember.compile_graph(gm, [x, w])
    assert_close(compiled([x, w.clone()]), expected)
    assert ember.metrics.collectives[str(c10d.all_reduce_.default)] == 1
    assert not [op for op in ember.metrics.fallbacks if "c10d" in op], ember.metrics.fallbacks


def _all_reduces(x, w):
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    dead = fc.all_reduce((x @ w).view(-1), "sum", group)       # a product nothing else reads: in place
    kept = x * 3
    read_again = fc.all_reduce(kept, "sum", group)              # read again below: the functional form
    an_input = fc.all_reduce(w, "sum", group)                   # the caller's tensor: never written
    return dead.sin(), read_again + kept, an_input * 2


def test_an_all_reduce_of_a_dying_input_runs_in_place():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    w_before = w.clone()
    expected = _all_reduces(x, w)
    with ember.config.patch(collective_bucket_bytes=0):     # bucketed, the three are one in-place all-reduce
        assert_close(torch.compile(_all_reduces, backend="ember")(x, w), expected)
    assert torch.equal(w, w_before)
    assert ember.metrics.collectives[str(c10d.all_reduce_.default)] == 1
    assert ember.metrics.collectives[str(c10d.all_reduce.default)] == 2


def test_a_graph_with_collectives_is_loaded_from_the_graph_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    expected = _independent_work(x, y)
    with ember.config.patch(graph_cache=True):
        for _ in range(2):
            torch._dynamo.reset()
            assert_close(torch.compile(_independent_work, backend="ember")(x, y), expected)
    assert ember.metrics.graph_cache_misses == 1 and ember.metrics.graph_cache_hits == 1
    # a hit counts the collectives the compile it replaces counted
    assert ember.metrics.collectives[str(c10d.all_reduce_.default)] == 2


# -- the overlap pass's memory budget ----------------------------------------------------------------------

def _three_all_reduces(x, y):
    """Three independent all-reduces of 4 x 8 floats (each holds 128 bytes in flight: its input, reduced in
    place) and products that need none of them."""
    a = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", _group()))
    b = c10d.wait_tensor(c10d.all_reduce(x + 1, "sum", _group()))
    c = c10d.wait_tensor(c10d.all_reduce(x.cos(), "sum", _group()))
    d = torch.mm(y, y).sin()
    e = torch.mm(d, y).relu()
    return a + b + c, e


def _in_flight(lines) -> list:
    """[(issue's position, its wait's position, whether any other call runs in between)] per collective."""
    calls = [ln for ln in lines if isinstance(ln, (CallKernel, CallExtern))]
    out = []
    for i, ln in enumerate(calls):
        if isinstance(ln, CallExtern) and ln.collective and ln.collective.kind == "issue":
            j = next(j for j, w in enumerate(calls) if isinstance(w, CallExtern) and w.collective and
                     w.collective.kind == "wait" and w.collective.issued_by == ln.name)
            out.append((i, j, any(not (isinstance(c, CallExtern) and c.collective) for c in calls[i + 1:j])))
    return out


@pytest.mark.parametrize("budget", [1, 200, 1 << 30])
def test_memory_budget_bounds_the_collectives_in_flight(programs, budget):
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    expected = _three_all_reduces(x, y)
    with ember.config.patch(overlap_memory_budget_bytes=budget, collective_bucket_bytes=0):
        assert_close(torch.compile(_three_all_reduces, backend="ember")(x, y), expected)
    spans = _in_flight(programs[0].lines)
    assert len(spans) == 3
    if budget == 1:         # larger than the budget: each wait right after its issue, nothing in between
        assert all(j == i + 1 for i, j, _ in spans), spans
    elif budget == 200:     # one collective at a time, with compute while it is in flight
        assert all(j1 < i2 for (_, j1, _), (i2, _, _) in zip(spans, spans[1:])), spans
        assert any(work for _, _, work in spans), spans
    else:                   # all three in flight together, over the products
        assert max(i for i, _, _ in spans) < min(j for _, j, _ in spans), spans
        assert all(work for _, _, work in spans), spans


def test_a_collective_of_symbolic_size_is_waited_for_at_once(programs):
    # its size hint is this rank's example, which other ranks need not share: not held in flight
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    expected = _three_all_reduces(x, y)
    with ember.config.patch(collective_bucket_bytes=0):
        assert_close(torch.compile(_three_all_reduces, backend="ember", dynamic=True)(x, y), expected)
    spans = _in_flight(programs[0].lines)
    assert len(spans) == 3 and all(j == i + 1 for i, j, _ in spans), spans


# -- bucketing ---------------------------------------------------------------------------------------------

def _traced(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn)(*args)


def _planned(fn, *args, cap=1 << 20) -> list:
    from ember.graph.passes.bucket_collectives import plan_buckets
    return [[str(m.args[0]) for m in bucket] for bucket in plan_buckets(_traced(fn, *args), cap)]


def _interleaved(x, y):
    """all_reduce A, all_gather B of A's result, all_reduce C, all_gather D of C's result: bucketing {A, C}
    and {B, D} would make each bucket wait for the other."""
    a = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", _group()))
    b = c10d.wait_tensor(c10d.all_gather_into_tensor(a + 1, 1, _group()))
    c = c10d.wait_tensor(c10d.all_reduce(y * 3, "sum", _group()))
    d = c10d.wait_tensor(c10d.all_gather_into_tensor(c - 1, 1, _group()))
    e = c10d.wait_tensor(c10d.all_gather_into_tensor(y.sin(), 1, _group()))
    return a, b, c, d, e


def test_bucketing_closes_a_bucket_a_collective_depends_on():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    # B depends on A: A's bucket closes, C starts another; D and E join B's bucket (neither depends on B)
    assert _planned(_interleaved, x, y) == [["add", "sub", "sin"]]
    expected = _interleaved(x, y)
    assert_close(torch.compile(_interleaved, backend="ember")(x, y), expected)
    assert ember.metrics.collective_buckets == 1 and ember.metrics.collectives_bucketed == 3


def _input_changed_between(x, y):
    a = c10d.wait_tensor(c10d.all_reduce(x, "sum", _group()))
    x.add_(1)
    b = c10d.wait_tensor(c10d.all_reduce(y, "sum", _group()))
    return a, b


def test_bucketing_stops_at_a_mutation():
    # merged, both all-reduces would read x after the add_
    assert _planned(_input_changed_between, torch.randn(4, 8), torch.randn(4, 8)) == []


def _sums_and_max(x, y):
    return [c10d.wait_tensor(c10d.all_reduce(v, op, _group())) for v, op in
            ((x * 2, "sum"), (y + 1, "sum"), (x.cos(), "max"), (y.t().contiguous(), "sum"), (x.sin(), "max"))]


def test_bucketing_matches_op_and_respects_the_cap():
    x, y = torch.randn(4, 8), torch.randn(8, 4)       # 128 bytes each
    assert _planned(_sums_and_max, x, y) == [["mul", "add", "clone"], ["cos", "sin"]]
    assert _planned(_sums_and_max, x, y, cap=256) == [["mul", "add"], ["cos", "sin"]]
    assert _planned(_sums_and_max, x, y, cap=255) == []
    expected = _sums_and_max(x, y)
    assert_close(torch.compile(_sums_and_max, backend="ember")(x, y), expected)


def test_a_graph_with_collectives_does_not_fall_back_on_one_rank_at_its_first_run():
    # another rank would run the compiled graph: the failure is raised, not hidden by an eager run here
    x, y = torch.randn(4, 8), torch.randn(16, 16)
    gm = _traced(_independent_work, x, y)
    compiled = ember.compile_graph(gm, [x, y])

    def fails(args):
        raise RuntimeError("first run fails")
    compiled.fn = fails
    with ember.config.patch(fallback_on_error=True), pytest.raises(RuntimeError, match="first run fails"):
        compiled([x, y])
    assert ember.metrics.eager_fallbacks == 0
