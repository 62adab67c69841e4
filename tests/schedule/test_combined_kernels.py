"""Combined kernels (schedule/combine.py): independent small pointwise kernels launched as one, checked
against eager with each backend that combines them (Triton, on a CPU through its interpreter; C++); and
how runs are cut."""
import contextlib

import pytest
import torch

import ember
from ember.device import backend_for
from ember.schedule import combine
from ember.testing import check


@pytest.fixture(params=["triton", "cpp"])
def combining_backend(device, request):
    """Each backend that combines kernels on the test device: on a CPU, Triton's interpreter and C++."""
    if device != "cpu" and request.param != "triton":
        pytest.skip("C++ kernels are a CPU backend")
    patch = ember.config.patch(cpu_backend=request.param) if device == "cpu" else contextlib.nullcontext()
    with patch:
        assert backend_for(torch.device(device)).combines_kernels
        yield device


def three_sizes(a, b, c):
    return a.sin() * 2, (b + 1).relu(), c.exp() - c


def test_independent_kernels_of_different_sizes_run_as_one(combining_backend):
    dev = combining_backend
    args = [torch.randn(37, device=dev), torch.randn(5, 300, device=dev), torch.randn(1029, device=dev)]
    check(three_sizes, *args)
    assert ember.metrics.combined_kernels == 1 and ember.metrics.combined_kernel_parts == 3
    assert ember.metrics.generated_kernel_count == 1


def test_off_by_setting(combining_backend):
    args = [torch.randn(37, device=combining_backend), torch.randn(5, 300, device=combining_backend),
            torch.randn(1029, device=combining_backend)]
    with ember.config.patch(combine_kernels=False):
        check(three_sizes, *args)
    assert ember.metrics.combined_kernels == 0 and ember.metrics.generated_kernel_count == 3


def test_a_kernel_reading_another_ones_output_is_not_its_part(combining_backend):
    def fn(a, b):
        x = a.sin()
        y = b.cos()
        # the sum reads x and y whole (a reduction), the last kernel reads it: three launches in order
        s = x.sum() + y.sum()
        return x, y, b * s
    dev = combining_backend
    check(fn, torch.randn(70, device=dev), torch.randn(9, 11, device=dev))


def test_updates_in_place_of_several_inputs(combining_backend):
    def fn(p, q, r, g):
        p.add_(g[:5] * 0.5)
        q.mul_(0.9).add_(1.0)
        r.sub_(r.sign())
        return p.sum()
    dev = combining_backend
    check(fn, torch.randn(5, device=dev), torch.randn(300, device=dev), torch.randn(17, 3, device=dev),
          torch.randn(5, device=dev))


@pytest.mark.parametrize("capturable", [False, True])
def test_adamw_step_of_many_parameters(combining_backend, capturable):
    """An optimizer step over parameters of repeated layers and of other sizes: the per-parameter updates
    run as few combined kernels, and the parameters and moments after two steps are eager's."""
    dev = combining_backend
    shapes = [(24, 16), (16,), (40, 16), (16,)] * 3 + [(97, 16), (16,)]
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(s, device=dev)) for s in shapes]
    mine = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    grads = [[torch.randn(s, device=dev) for s in shapes] for _ in range(2)]
    # eager's capturable step runs on accelerators only; the non-capturable one computes the same
    opts = [torch.optim.AdamW(ps, lr=1e-2, foreach=True, capturable=c)
            for ps, c in ((ref, capturable and dev != "cpu"), (mine, capturable))]
    step = torch.compile(opts[1].step, backend="ember")
    for g in grads:
        for p, q, gi in zip(ref, mine, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        opts[0].step()
        step()
    for p, q in zip(ref, mine):
        torch.testing.assert_close(q, p)
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opts[1].state[q][k], opts[0].state[p][k])
    assert not ember.metrics.fallbacks
    assert ember.metrics.combined_kernels >= 1
    # the 14 updates launch in combined kernels of at most COMBINED_MAX_PARTS parts
    assert ember.metrics.combined_kernel_parts >= 12


# -- how runs are cut ------------------------------------------------------------------------------------

class FakeGroup:
    def __init__(self, i, reads=(), writes=(), key="k"):
        self.id, self.reads, self.writes, self.key = i, set(reads), set(writes) or {f"out{i}"}, key

    def device(self):
        return torch.device("cpu")


def units(groups, eligible=lambda g: True):
    return combine.combined_units(groups, eligible, lambda g: g.key)


def test_dependent_groups_start_a_new_unit():
    gs = [FakeGroup(0, ["a"]), FakeGroup(1, ["out0"]), FakeGroup(2, ["b"]), FakeGroup(3, ["c"], ["a"])]
    # 1 reads what 0 writes; 3 writes `a`, which only 0 (of another unit) read
    assert units(gs) == [[0], [1, 2, 3]]
    gs = [FakeGroup(0, ["a"]), FakeGroup(1, ["b"], ["a"])]      # writes what an earlier part reads
    assert units(gs) == [[0], [1]]


def test_ineligible_groups_cut_runs():
    gs = [FakeGroup(i, [f"in{i}"]) for i in range(5)]
    assert units(gs, lambda g: g.id != 2) == [[0, 1], [2], [3, 4]]


def test_repeated_layers_are_cut_alike():
    keys = ["embed"] + ["wq", "wk", "norm"] * 10 + ["head"]
    gs = [FakeGroup(i, [f"in{i}"], key=k) for i, k in enumerate(keys)]
    got = units(gs)
    assert [i for u in got for i in u] == list(range(len(keys)))
    assert got[0] == [0]                                  # the prefix before the repetition
    per_layer = combine.COMBINED_MAX_PARTS // 3 * 3
    assert len(got[1]) == per_layer and [keys[i] for i in got[1]] == [keys[i] for i in got[2]]
    assert all(len(u) <= combine.COMBINED_MAX_PARTS for u in got)


def test_pointer_limit_cuts_a_unit(monkeypatch):
    monkeypatch.setattr(combine, "COMBINED_MAX_POINTERS", 6)
    gs = [FakeGroup(i, [f"in{i}", "shared"], key=str(i)) for i in range(6)]      # 2 or 3 buffers each
    got = units(gs)
    assert [i for u in got for i in u] == list(range(6))
    assert all(len(set().union(*(gs[i].reads | gs[i].writes for i in u))) <= 6 for u in got)
    assert len(got) == 3


def test_a_part_writes_over_an_input_that_dies_in_it(combining_backend):
    def fn(a, w, b):
        x = a @ w                   # the product's memory is the wrapper's; nothing reads it after the sine
        return x.sin() + 1, b.cos()
    dev = combining_backend
    check(fn, torch.randn(8, 16, device=dev), torch.randn(16, 24, device=dev), torch.randn(300, device=dev),
          rtol=1e-4, atol=1e-4)
    assert ember.metrics.combined_kernels == 1
    assert ember.metrics.in_place_buffers == 1


def test_a_mutation_after_a_read_of_its_input_is_not_a_part_beside_it(combining_backend):
    def fn(a, b):
        x = a[:5].sin()             # reads a before ...
        a.mul_(2)                   # ... a is written: two launches, in this order
        return x, b.cos()
    dev = combining_backend
    check(fn, torch.randn(37, device=dev), torch.randn(300, device=dev))


# -- gathering eligible groups that stand apart -------------------------------------------------------------

def projections_with_casts(x, wq, wk, wv):
    """Autocast's pattern: each weight cast right before the product that reads it (a layer's query, key
    and value projections of one input)."""
    q, k, v = (x @ w.to(torch.bfloat16) for w in (wq, wk, wv))
    return torch.tanh(q) + k * v


def casts_beside_draws(x, wq, wk, wv):
    """projections_with_casts, each product scaled by a dropout's keep flags drawn as bits (`| 255` keeps
    every flag), whose kernels take their seed's position as a parameter."""
    def kept(i):             # draws of different sizes: kernels of their own, each a part
        bits = torch.ops.ember.dropout_bits(512 + 8 * i, 0.5, x.device)
        return (bits[:128] | 255).eq(255).view(8, 16)
    q, k, v = ((x @ w.to(torch.bfloat16)) * kept(i) for i, w in enumerate((wq, wk, wv)))
    return torch.tanh(q) + k * v


# (the graph, its combined kernels' parts, its kernels with and without combining): the casts (and the draws)
# read only inputs, and are gathered into one combined kernel ahead of the first product
CASTS = {"alone": (projections_with_casts, 3, 2, 4), "beside draws": (casts_beside_draws, 5, 3, 7)}


@pytest.mark.parametrize("graph", sorted(CASTS))
def test_weight_casts_between_products_launch_as_one(combining_backend, graph):
    fn, parts, combined, apart = CASTS[graph]
    dev = combining_backend
    x = torch.randn(8, 16, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(16, 16, device=dev) / 4 for _ in range(3)]
    check(fn, x, *ws, rtol=2e-2, atol=2e-2)
    assert ember.metrics.combined_kernels == 1 and ember.metrics.combined_kernel_parts == parts
    assert ember.metrics.generated_kernel_count == combined
    ember.metrics.reset()
    with ember.config.patch(combine_kernels=False):
        check(fn, x, *ws, rtol=2e-2, atol=2e-2)
    assert ember.metrics.generated_kernel_count == apart


def test_repeated_layers_draw_from_their_own_seeds(combining_backend, monkeypatch):
    """Two layers' draw and cast, two combined kernels of one structure: the second launches the first's
    kernel with its own seed positions, so the layers' bits differ."""
    monkeypatch.setattr(combine, "COMBINED_MAX_PARTS", 2)

    def two_layers(x, w0, w1):
        bits = []
        for w in (w0, w1):
            bits.append(torch.ops.ember.dropout_bits(1 << 17, 0.5, x.device))   # past sibling fusion
            x = x @ w.to(torch.bfloat16)
        return x, *bits
    dev = combining_backend
    x = torch.randn(8, 16, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(16, 16, device=dev) / 4 for _ in range(2)]
    out, bits0, bits1 = torch.compile(two_layers, backend="ember")(x, *ws)
    torch.testing.assert_close(out, two_layers(x, *ws)[0], rtol=2e-2, atol=2e-2)
    assert ember.metrics.combined_kernels == 2
    assert (bits0 != bits1).float().mean() > 0.9


class FakeNode:
    def __init__(self):
        self.deps = set()


class NodeGroup(FakeGroup):
    def __init__(self, i, deps=(), eligible=True, nbytes=4):
        super().__init__(i)
        self.nodes = [FakeNode()]
        self.nodes[0].deps = {d.nodes[0] for d in deps}
        self.eligible, self.nbytes = eligible, nbytes


def gathered(groups):
    sizes = {f"out{g.id}": g.nbytes for g in groups}
    return [g.id for g in combine.gather_combinable(groups, sizes.get, lambda g: g.eligible)]


def test_eligible_groups_move_up_past_groups_they_do_not_depend_on():
    g0 = NodeGroup(0)
    p1 = NodeGroup(1, [g0], eligible=False)          # a product reading the first cast
    g2 = NodeGroup(2)
    p3 = NodeGroup(3, [g2, p1], eligible=False)
    g4 = NodeGroup(4)
    t5 = NodeGroup(5, [p3])                           # eligible, but reads the product before it
    assert gathered([g0, p1, g2, p3, g4, t5]) == [0, 2, 4, 1, 3, 5]


def test_gathering_holds_at_most_its_bytes(monkeypatch):
    monkeypatch.setattr(combine, "GATHER_MAX_BYTES", 10)
    gs = []
    for i in range(0, 8, 2):
        gs += [NodeGroup(i, nbytes=4), NodeGroup(i + 1, [gs[-1]] if gs else [], eligible=False)]
    # 2 and 4 move up to 0 (8 bytes held); 6 would hold 12: it opens the next gathering where it stands
    assert gathered(gs) == [0, 2, 4, 1, 3, 5, 6, 7]


def test_a_group_of_symbolic_size_does_not_move():
    gs = [NodeGroup(0), NodeGroup(1, eligible=False), NodeGroup(2, nbytes=None)]
    assert gathered(gs) == [0, 1, 2]
