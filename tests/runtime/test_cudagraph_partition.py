"""CUDA graphs split around what cannot be recorded (runtime/cudagraph_partition.py). On the CPU captures are
emulated (EmulatedCapture, as in test_cudagraphs.py); with EMBER_TEST_DEVICE=cuda the same tests record real
CUDA graphs, and the test of a CPU tensor in the middle of a graph runs only there."""
import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import ember
from ember.runtime import cudagraphs
from ember.runtime.cudagraph_partition import compile_partitioned, split_segments


@pytest.fixture(autouse=True)
def _emulate_and_capture_data_dependent_ops(monkeypatch):
    monkeypatch.setattr(cudagraphs, "EMULATE_ON_CPU", True)
    # Dynamo breaks the graph at `.item()` and `nonzero` unless told to keep them in it
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        yield


@torch.library.custom_op("ember_test_cudagraphs::host_scale", mutates_args=(),
                         tags=(torch.Tag.cudagraph_unsafe,))
def host_scale(x: torch.Tensor) -> torch.Tensor:
    """An op a CUDA graph must not record (its scale is read on the host)."""
    return x * (1.0 + float(x.detach().abs().max().cpu()))


@host_scale.register_fake
def _(x):
    return torch.empty_like(x)


def _compile(fn, **kw):
    return torch.compile(fn, backend="ember", mode="reduce-overhead", **kw)


def _with_positives(n_positive: int, *shape, device="cpu"):
    """Fresh random values of which exactly `n_positive` are > 0, at random places."""
    x = torch.randn(*shape, device=device).abs() + 0.1
    flat = x.view(-1)
    negative = torch.randperm(flat.numel(), device=device)[n_positive:]
    flat[negative] = -flat[negative]
    return x


def _counters():
    m = ember.metrics
    return m.cudagraph_records, m.cudagraph_replays, m.cudagraph_partitions


# -- where the graph is split --------------------------------------------------------------------------------

def _forward_graph(fn, *args, **kw):
    """The ATen forward graph AOTAutograd hands a backend for fn(*args)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    torch.compile(fn, backend=aot_autograd(fw_compiler=keep), **kw)(*args)
    return graphs[0]


def _names(segment):
    return [n.name for n in segment.nodes]


def test_split_around_item():
    def f(x):
        y = x.sin() * 2
        n = (y > 0).sum().item()
        return y.cos() * n
    gm = _forward_graph(f, torch.randn(10))
    first, between, last = split_segments(gm, "cpu")
    assert (first.captured, between.captured, last.captured) == (True, False, True)
    # `cos` does not read the count: it joins the first partition
    assert _names(first) == ["sin", "mul", "gt", "sum_1", "cos"]
    assert _names(between) == ["_local_scalar_dense"]
    assert any("synchronizes with the host" in w for w in between.why)
    assert _names(last) == ["mul_1"]
    # what crosses: `cos` goes from the first to the last, the count from the middle to the last
    assert [a.name for a in last.inputs] == ["cos", "_local_scalar_dense"]
    assert [n.name for n in first.outputs] == ["sum_1", "cos"]


def test_split_around_nonzero_keeps_data_dependent_sizes_between_partitions():
    def f(x):
        y = x.sin() * 2
        idx = torch.nonzero(y > 0)
        return idx.float().sum() + y.exp()
    gm = _forward_graph(f, torch.randn(10))
    first, between, last = split_segments(gm, "cpu")
    assert (first.captured, between.captured, last.captured) == (True, False, True)
    assert _names(first) == ["sin", "mul", "gt", "exp"]
    # nonzero, the runtime checks of its size and everything that reads its rows run between the partitions
    assert _names(between)[0] == "nonzero" and _names(between)[-1] == "sum_1"
    assert "_to_copy" in _names(between)
    assert [a.name for a in last.inputs] == ["sum_1", "exp"]


def test_split_around_a_cpu_tensor():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        c = x.sin().cpu() * 2
        return c.to(x.device).cos()
    with FakeTensorMode():
        gm = make_fx(f)(torch.empty(4, device="cuda"))
    first, between, last = split_segments(gm, "cuda")
    assert _names(first) == ["sin"] and _names(last) == ["cos"]
    # the copy to the host, the op on the host and the copy back (it reads a CPU tensor)
    assert _names(between) == ["_to_copy", "mul", "_to_copy_1"] and not between.captured
    assert any("reads mul, a cpu tensor" in w for w in between.why)


def test_split_around_an_op_tagged_cudagraph_unsafe():
    gm = _forward_graph(lambda x: host_scale(x.sin()).cos() * 2, torch.randn(6))
    segments = split_segments(gm, "cpu")
    assert [s.captured for s in segments] == [True, False, True]
    assert _names(segments[1]) == ["host_scale"]
    assert any("cudagraph_unsafe" in w for w in segments[1].why)


def test_a_run_of_views_alone_is_not_recorded():
    gm = _forward_graph(lambda x: host_scale(x.sin()).view(2, -1).t(), torch.randn(6))
    segments = split_segments(gm, "cpu")
    assert [s.captured for s in segments] == [True, False]
    assert _names(segments[1]) == ["host_scale", "view", "t"]


def test_what_does_not_read_a_blocker_moves_before_it():
    def f(x):
        kept = x[x > 0]
        return x.tanh() * kept.sum()
    gm = _forward_graph(f, torch.randn(6, 3))
    assert [n.name for n in gm.graph.nodes].index("tanh") > [n.name for n in gm.graph.nodes].index("index")
    first, between, last = split_segments(gm, "cpu")
    assert _names(first) == ["gt", "tanh"]
    assert _names(between)[0] == "index" and _names(between)[-1] == "sum_1"
    assert [n.target for n in last.nodes] == [torch.ops.aten.mul.Tensor]


def test_nothing_moves_past_an_op_that_draws_random_numbers():
    def f(x):
        n = (x > 0).sum().item()
        r = torch.rand_like(x)
        return x.exp() + r, n
    gm = _forward_graph(f, torch.randn(6))
    first, between, last = split_segments(gm, "cpu")
    assert _names(first) == ["gt", "sum_1"] and _names(between) == ["_local_scalar_dense"]
    assert _names(last) == ["rand_like", "exp", "add"]


def test_a_partition_takes_the_size_symbols_it_reads_as_integer_inputs():
    def f(x):
        y = x.sin()
        n = (y > 0).sum().item()
        return y.cos() * n
    gm = _forward_graph(f, torch.randn(10), dynamic=True)
    size = next(n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta["val"], torch.SymInt))
    last = split_segments(gm, "cpu")[-1]
    assert last.captured
    assert size in last.inputs and any(a.name == "_local_scalar_dense" for a in last.inputs)


def test_graphs_without_blockers_or_with_whole_graph_settings_are_not_split():
    x = torch.randn(8)
    gm = _forward_graph(lambda x: x.sin() * 2, x)
    assert compile_partitioned(gm, [x], "inference") is None
    gm = _forward_graph(lambda x: x.sin() * x.sum().item(), x)
    with ember.config.patch(debug_sync=True):
        assert compile_partitioned(gm, [x], "inference") is None


# -- through torch.compile -------------------------------------------------------------------------------------

def _matches_eager(f, make_input, steps=5, **kw):
    cm = _compile(f, **kw)
    # every step's input is kept: a fresh input then never lands where an earlier one was freed (which the
    # allocator may or may not do), so each input moves and the counters below do not depend on chance
    inputs = []
    for step in range(steps):
        inputs.append(make_input())
        torch.testing.assert_close(cm(inputs[-1]), f(inputs[-1]), rtol=1e-5, atol=1e-5)


def test_item_in_the_middle(device):
    def f(x):
        y = x.sin() * 2
        n = (x > 0).sum().item()
        return y.cos() * n
    _matches_eager(f, lambda: _with_positives(7, 10, device=device), steps=6)
    # two partitions, each warmed up at the first call, recorded at the second, replayed from then on
    assert _counters() == (2, 10, 2)


def test_item_with_a_different_value_each_call(device):
    def f(x):
        n = (x > 0).sum().item()
        return x.exp() * n + 1
    counts = iter((3, 5, 3, 5, 3, 8, 8))
    _matches_eager(f, lambda: _with_positives(next(counts), 4, 4, device=device), steps=7)
    # the partition after the count keeps a recording per count, like one per size
    assert ember.metrics.cudagraph_partitions == 2
    assert ember.metrics.cudagraph_replays >= 3


def test_nonzero_in_the_middle(device):
    def f(x):
        y = x.sin() * 2
        rows = torch.nonzero(x > 0)
        return rows.float().sum() + y.exp()
    _matches_eager(f, lambda: _with_positives(11, 4, 8, device=device))
    # the allocator (CUDA's caching allocator, and the CPU's malloc alike) may hand the count between the
    # partitions the block an earlier step freed, or not: the last partition is then recorded once or
    # twice more
    records, replays, partitions = _counters()
    assert partitions == 2 and 2 <= records <= 4 and replays >= 6


def test_boolean_mask_in_the_middle_with_dynamic_sizes(device):
    def f(x):
        kept = x[x > 0]
        return x.tanh() * kept.sum()
    sizes = iter((6, 9, 6, 9, 6))
    _matches_eager(f, lambda: torch.randn(next(sizes), 3, device=device), dynamic=True)
    assert ember.metrics.cudagraph_partitions == 2
    assert ember.metrics.cudagraph_replays >= 2


def test_op_tagged_cudagraph_unsafe_in_the_middle(device):
    _matches_eager(lambda x: host_scale(x.sin() + 1).cos() * 2, lambda: torch.randn(16, device=device))
    records, replays, partitions = _counters()
    # each partition recorded once; the one after the op reads the op's fresh output, which the caching
    # allocator may place where the warm-up's was and later elsewhere: then it is recorded once more
    assert partitions == 2 and replays == 8 and records in (2, 3)


def test_cpu_tensor_in_the_middle(device):
    if device == "cpu":
        pytest.skip("needs a device besides the CPU")

    def f(x):
        host = (x.sin() * 2).cpu()
        return (host.abs().sqrt() + 1).to(x.device).log() * x
    _matches_eager(f, lambda: torch.randn(32, device=device))
    records, replays, partitions = _counters()
    # the partition after the host reads a fresh copy back from it: recorded once more if that moves
    assert partitions == 2 and replays == 8 and records in (2, 3)


def test_held_outputs_of_a_partition_are_never_overwritten(device):
    def f(x):
        y = x * 3 + 1                      # an output of the first partition, returned to the program
        n = (x > 0).sum().item()
        return y, y.sin() * n
    cm = _compile(f)
    kept, expect = [], []
    for step in range(6):
        x = _with_positives(5, 12, device=device)
        kept.append(cm(x))
        expect.append(f(x))
    for (a, b), (ra, rb) in zip(kept, expect):
        torch.testing.assert_close(a, ra, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, rb, rtol=1e-5, atol=1e-5)
    assert ember.metrics.cudagraph_output_copies >= 4


def test_an_input_written_in_place_around_an_item(device):
    def step(cache, x, pos):
        cache.index_copy_(0, pos, x.exp())
        k = (x > 0).sum().item()
        return cache.sum(0, keepdim=True).tanh() * k

    cm = _compile(step)
    cache = torch.randn(16, 8, device=device)
    ref_cache = cache.clone()
    for t in range(8):
        x = _with_positives(3, 1, 8, device=device)
        pos = torch.tensor([t], device=device)
        torch.testing.assert_close(cm(cache, x, pos), step(ref_cache, x, pos), rtol=1e-4, atol=1e-5)
        # the cache is a plain input: copied into the recording's buffer, written back after each replay
        torch.testing.assert_close(cache, ref_cache, rtol=1e-4, atol=1e-5)
    assert _counters() == (2, 14, 2)


def test_training_through_a_split_graph(device):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            y = torch.tanh(self.a(x))
            n = (x > 0).sum().item()
            return self.b(y) * n

    torch.manual_seed(0)
    model, ref = Net().to(device), Net().to(device)
    ref.load_state_dict(model.state_dict())
    cm = _compile(model)
    for step in range(12):
        x = _with_positives(12, 4, 8, device=device)
        loss = cm(x).pow(2).mean()
        loss.backward()
        ref_loss = ref(x).pow(2).mean()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
        if step == 8:
            settled, replays = ember.metrics.cudagraph_records, ember.metrics.cudagraph_replays
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    # the forward's two partitions and the backward (whole: it only reads the count) replay at every step
    # after the first; the backward reads the forward's input `x`, a new tensor each step, in place until
    # the runner finds that it keeps moving, and records anew until then (once running uncaptured while
    # the forward is recorded anew, so that both stay in one pool)
    assert ember.metrics.cudagraph_partitions == 3
    assert ember.metrics.cudagraph_replays == replays + 3 * 3
    assert ember.metrics.cudagraph_records == settled
    assert ember.metrics.cudagraph_output_copies == 0


def test_a_graph_without_blockers_is_recorded_whole(device):
    cm = _compile(lambda x: (x.sin() * 2).sum(0))
    for step in range(4):
        x = torch.randn(5, 6, device=device)
        torch.testing.assert_close(cm(x), (x.sin() * 2).sum(0), rtol=1e-5, atol=1e-5)
    assert _counters() == (1, 3, 0)


def test_whole_graph_settings_keep_cuda_graphs_off(device):
    def f(x):
        return host_scale(x.exp()) * 2
    with ember.config.patch(debug_sync=True):
        cm = _compile(f)
        for step in range(3):
            x = torch.randn(6, device=device)
            torch.testing.assert_close(cm(x), f(x), rtol=1e-5, atol=1e-5)
    assert _counters() == (0, 0, 0)
