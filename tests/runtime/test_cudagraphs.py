"""CUDA graphs (runtime/cudagraphs.py). On the CPU the runner's logic runs with EmulatedCapture, whose replay
writes into the recorded outputs' memory as a CUDA graph's does, so that overwritten outputs show; the same
tests record real CUDA graphs with EMBER_TEST_DEVICE=cuda."""
import warnings

import pytest
import torch

import ember
from ember.runtime import cudagraphs
from ember.runtime.cudagraphs import CudaGraphRunner, EmulatedCapture, capture_blockers, mutated_inputs


@pytest.fixture(autouse=True)
def _emulate(monkeypatch):
    monkeypatch.setattr(cudagraphs, "EMULATE_ON_CPU", True)


def _compile(fn, **kw):
    return torch.compile(fn, backend="ember", mode="reduce-overhead", **kw)


# -- the runner on its own ----------------------------------------------------------------------------------

def _runner(fn, **kw):
    def boxed(args):
        a = list(args)
        args.clear()
        return fn(*a)
    return CudaGraphRunner(boxed, capture_factory=EmulatedCapture, **kw)


def test_runner_warms_up_records_then_replays():
    w = torch.randn(8)
    r = _runner(lambda x, w: (x * w + 1,), static_inputs=[1])
    for step in range(5):
        x = torch.randn(8)
        (out,) = r([x, w])
        torch.testing.assert_close(out, x * w + 1)
    # `out` of one step is still held while the next step runs: found once, then returned as a copy
    assert ember.metrics.cudagraph_records == 2
    assert ember.metrics.cudagraph_replays == 4        # the first call is the warm-up
    assert r.copy_outputs == {0}


def test_outputs_let_go_are_not_copied():
    r = _runner(lambda x: (x.exp(),))
    for step in range(5):
        x = torch.randn(8)
        torch.testing.assert_close(r([x])[0], x.exp())
    assert ember.metrics.cudagraph_records == 1
    assert ember.metrics.cudagraph_output_copies == 0


def test_inputs_that_stay_put_are_read_in_place_and_moving_ones_copied():
    r = _runner(lambda x, y: (x * y,))
    x = torch.randn(8)                  # refilled in place every step: its address never moves
    ys = [torch.randn(8) for _ in range(2)]
    for step in range(6):
        x.normal_()
        y = ys[step % 2].normal_()      # a new tensor at each call, as a new batch is
        torch.testing.assert_close(r([x, y])[0], x * y)
    rec = r.sizes[()].recording
    assert set(rec.buffers) == {1}      # x is read where it lies, y is copied into the recording's buffer
    assert ember.metrics.cudagraph_records == 1


def test_an_input_that_starts_moving_is_recorded_once_more_then_copied():
    r = _runner(lambda x: (x.exp(),))
    x = torch.randn(8)
    for step in range(3):               # warm-up, record, replay: x stays put
        x.normal_()
        torch.testing.assert_close(r([x])[0], x.exp())
    for step in range(4):               # then it moves at every call
        x = torch.randn(8)
        torch.testing.assert_close(r([x])[0], x.exp())
    assert ember.metrics.cudagraph_records == 2
    assert set(r.sizes[()].recording.buffers) == {0}


def test_held_outputs_are_never_overwritten():
    r = _runner(lambda x: (x.sin(), x.cos()))
    kept, expect = [], []
    for step in range(6):
        x = torch.randn(16)
        out = r([x])
        kept.append(out[0])                 # the first output is held, the second let go
        expect.append(x.sin())
        torch.testing.assert_close(out[1], x.cos())
        del out
    for k, e in zip(kept, expect):
        torch.testing.assert_close(k, e)
    assert r.copy_outputs == {0}
    assert ember.metrics.cudagraph_output_copies >= 3
    assert ember.metrics.cudagraph_records == 2        # recorded once more when the hold was found


def test_a_view_of_an_output_counts_as_holding_it():
    r = _runner(lambda x: (x * 2,))
    views, expect = [], []
    for step in range(4):
        x = torch.randn(4, 4)
        (y,) = r([x])
        views.append(y[1])
        expect.append((x * 2)[1])
    for v, e in zip(views, expect):
        torch.testing.assert_close(v, e)


def test_output_fed_back_as_the_next_input():
    r = _runner(lambda x: (x * 0.5 + 1,))
    x = torch.randn(8)
    ref = x.clone()
    for step in range(6):
        (x,) = r([x])
        ref = ref * 0.5 + 1
    torch.testing.assert_close(x, ref)


def test_copied_input_written_by_the_graph_is_written_back():
    def step(cache, x):
        cache.add_(x)
        return (cache.sum(),)
    r = _runner(step, mutated=frozenset({0}))
    cache, ref = torch.randn(5), None
    ref = cache.clone()
    for i in range(5):
        x = torch.randn(5)
        (s,) = r([cache, x])
        ref += x
        torch.testing.assert_close(cache, ref)
        torch.testing.assert_close(s, ref.sum())


def test_several_moving_inputs_of_several_dtypes_are_copied_in_and_written_back():
    # the copies of one replay go out together, one multi-tensor copy per dtype
    def step(cache, half_cache, x, y, z):
        cache.add_(x)
        half_cache.mul_(2)
        return (cache * y.float() + z, half_cache.float().sum())
    r = _runner(step, mutated=frozenset({0, 1}))
    for i in range(5):
        cache, half_cache = torch.randn(6), torch.randn(6, dtype=torch.bfloat16)    # every input moves
        x, y, z = torch.randn(6), torch.randn(6, dtype=torch.bfloat16), torch.randn(6)
        ref, half_ref = cache + x, half_cache * 2
        out, total = r([cache, half_cache, x, y, z])
        torch.testing.assert_close(cache, ref)
        torch.testing.assert_close(half_cache, half_ref)
        torch.testing.assert_close(out, ref * y.float() + z)
        torch.testing.assert_close(total, half_ref.float().sum())
    assert set(r.sizes[()].recording.buffers) == {0, 1, 2, 3, 4}


def _torch_address_check(tensors, ptrs, indices):
    """torch's C++ `_tensors_data_ptrs_at_indices_equal` (CUDA builds), written out: `ptrs` is indexed like
    `tensors`, and only `indices` are compared."""
    assert type(tensors) is list and type(ptrs) is list and type(indices) is list
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


@pytest.mark.parametrize("check", ["python", "torch"])
def test_moved_inputs_are_found_by_either_address_check(monkeypatch, check):
    from ember.runtime import cudagraph_memory
    monkeypatch.setattr(cudagraph_memory, "_ptrs_at_indices_equal", None if check == "python" else _torch_address_check)
    w, x = torch.randn(4, 2), torch.randn(3, 4)
    r = _runner(lambda x, s, w: (x @ w * s,), static_inputs=[2], int_inputs=[1])
    for step in range(3):
        x.normal_()
        torch.testing.assert_close(r([x, 2, w])[0], x @ w * 2)
    rec = r.sizes[(2,)].recording
    assert rec.address_indices == [0, 2] and rec.ptr_at_index[1] is None
    assert cudagraph_memory.addresses_unmoved(rec, [x, 2, w])
    assert not cudagraph_memory.addresses_unmoved(rec, [x, 2, w.clone()])
    assert not cudagraph_memory.addresses_unmoved(rec, [x.clone(), 2, w])
    w = torch.randn(4, 2)                # a parameter replaced: recorded again, with the right result
    torch.testing.assert_close(r([x, 2, w])[0], x @ w * 2)
    assert ember.metrics.cudagraph_records == 2


def test_static_input_that_moves_is_recorded_again():
    r = _runner(lambda x, w: (x @ w,), static_inputs=[1])
    x = torch.randn(3, 4)
    for i in range(4):
        w = torch.randn(4, 2)        # a new parameter tensor each call
        (y,) = r([x, w])
        torch.testing.assert_close(y, x @ w)


def test_one_recording_per_size_with_a_limit():
    r = _runner(lambda n, x: (x[:n] + 1,), int_inputs=[0])
    with ember.config.patch(cudagraph_max_sizes=2), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in (3, 3, 3, 4, 4, 5, 5, 3, 3):
            x = torch.randn(8)
            (y,) = r([n, x])
            torch.testing.assert_close(y, x[:n] + 1)
    assert len(r.sizes) == 2
    assert sum("cudagraph_max_sizes" in str(m.message) for m in w) == 1


def test_a_capture_that_fails_runs_uncaptured_with_one_warning():
    class Failing(EmulatedCapture):
        def capture(self, fn, args):
            raise RuntimeError("operation not permitted when stream is capturing")

    def boxed(args):
        (x,) = args
        args.clear()
        return (x + 1,)
    r = CudaGraphRunner(boxed, capture_factory=Failing)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(4):
            x = torch.randn(3)
            torch.testing.assert_close(r([x])[0], x + 1)
    assert sum("CUDA graph failed" in str(m.message) for m in w) == 1
    assert r.disabled is not None


# -- graph analysis --------------------------------------------------------------------------------------------

def _aten_graph(fn, *args, mode="real"):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode=mode)(*args)


def test_blockers_name_host_syncs_and_other_devices():
    gm = _aten_graph(lambda x: x.sum().item() + x, torch.randn(3), mode="symbolic")
    why = capture_blockers(gm, "cpu")
    assert any("synchronizes with the host" in w for w in why)
    gm = _aten_graph(lambda x: x + 1, torch.randn(3))
    assert capture_blockers(gm, "cpu") == []
    assert any("cpu tensor" in w for w in capture_blockers(gm, "cuda"))


def test_blockers_name_data_dependent_sizes():
    gm = _aten_graph(lambda x: x.nonzero(), torch.randn(6), mode="symbolic")
    assert capture_blockers(gm, "cpu")


def test_mutated_inputs_from_the_schema():
    def f(a, b, c):
        a.add_(1)
        c.index_copy_(0, torch.tensor([0]), b[:1])
        return a + b
    gm = _aten_graph(f, torch.randn(3), torch.randn(3), torch.randn(3))
    assert mutated_inputs(gm) == {0, 2}


# -- through torch.compile ------------------------------------------------------------------------------------

def _mlp_and_copy(device):
    """A small MLP and an eager copy of it with the same parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
    ref.load_state_dict(model.state_dict())
    return model, ref


def test_reduce_overhead_model_training_matches_eager(device):
    model, ref = _mlp_and_copy(device)
    cm = _compile(model)
    losses, ref_losses = [], []
    for step in range(5):
        x = torch.randn(8, 16, device=device)
        loss = cm(x).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())            # kept across steps
        rl = ref(x).pow(2).mean()
        rl.backward()
        ref_losses.append(rl.detach())
    for a, b in zip(losses, ref_losses):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert ember.metrics.cudagraph_replays >= 6


def test_reduce_overhead_decode_loop_with_an_in_place_cache(device):
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.register_buffer("cache", torch.zeros(16, 8))

        def forward(self, x, pos):
            self.cache.index_copy_(0, pos, self.proj(x))
            return self.cache.sum(0, keepdim=True).tanh()

    torch.manual_seed(0)
    model, ref = Step().to(device), Step().to(device)
    ref.load_state_dict(model.state_dict())
    cm = _compile(model)
    x = torch.randn(1, 8, device=device)
    xr = x.clone()
    outs, ref_outs = [], []
    with torch.no_grad():
        for t in range(8):
            pos = torch.tensor([t], device=device)
            x = cm(x, pos)                  # the output is the next input, and kept
            xr = ref(xr, pos)
            outs.append(x)
            ref_outs.append(xr)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.cache, ref.cache, rtol=1e-4, atol=1e-5)
    assert ember.metrics.cudagraph_replays >= 5


def test_reduce_overhead_dynamic_sizes(device):
    cm = _compile(lambda x: (x.softmax(-1) * 2).sum(0), dynamic=True)
    for n in (5, 7, 5, 7, 9, 9, 5):
        x = torch.randn(n, 6, device=device)
        torch.testing.assert_close(cm(x), (x.softmax(-1) * 2).sum(0), rtol=1e-5, atol=1e-5)


def test_dropout_masks_differ_between_replays(device):
    cm = _compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
    x = torch.ones(4096, device=device)
    masks = [cm(x) != 0 for _ in range(5)]
    assert all(0.4 < m.float().mean() < 0.6 for m in masks)
    assert not torch.equal(masks[-1], masks[-2])
    assert ember.metrics.cudagraph_replays >= 3


def test_unknown_mode_is_a_clear_error():
    cm = torch.compile(lambda x: x + 1, backend="ember", mode="fastest")
    with pytest.raises(Exception, match="unknown torch.compile mode"):
        cm(torch.randn(3))


def test_reduce_overhead_on_cpu_without_emulation_runs_normally(monkeypatch):
    monkeypatch.setattr(cudagraphs, "EMULATE_ON_CPU", False)
    cm = _compile(lambda x: x.exp() + 1)
    for i in range(3):
        x = torch.randn(5)
        torch.testing.assert_close(cm(x), x.exp() + 1)
    assert ember.metrics.cudagraph_records == 0


def test_a_later_recordings_held_output_keeps_an_earlier_one_from_replaying():
    # two graphs in one pool, recorded a then b: replaying a may write where b's outputs lie
    a = _runner(lambda x: (x + 1,))
    b = _runner(lambda x: (x * 3,))
    for step in range(2):                       # warm-up, then record a, then b
        torch.testing.assert_close(a([torch.ones(4)])[0], torch.full((4,), 2.0))
        torch.testing.assert_close(b([torch.ones(4)])[0], torch.full((4,), 3.0))
    b_pool = _pool_of(b)
    held = b([torch.ones(4)])[0]                # b's output is held while a runs
    torch.testing.assert_close(a([torch.ones(4)])[0], torch.full((4,), 2.0))
    assert b.copy_outputs == {0}
    assert b.sizes[()].recording is None         # b dropped; a is recorded anew (in a fresh pool, as the
    assert a.sizes[()].recording is None         # held output lies in the old one, after one uncaptured call)
    torch.testing.assert_close(a([torch.ones(4)])[0], torch.full((4,), 2.0))
    assert ember.metrics.cudagraph_records == 3
    assert _pool_of(a) is not b_pool
    torch.testing.assert_close(held, torch.full((4,), 3.0))
    torch.testing.assert_close(b([torch.ones(4)])[0], torch.full((4,), 3.0))
    assert ember.metrics.cudagraph_records == 4


def test_training_loop_with_an_optimizer_settles_to_replays_without_copies(device):
    model, ref = _mlp_and_copy(device)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    cm = _compile(model)

    def steps(n):
        for step in range(n):
            x = torch.randn(8, 16, device=device)
            for m, o in ((cm, opt), (ref, ref_opt)):
                m(x).pow(2).mean().backward()
                o.step()
                o.zero_grad()
    steps(6)
    # forward and backward recorded once each, and once more if the batch first stayed where the warm-up's
    # was and then moved (the allocator decides); from then on every step replays both
    assert 2 <= ember.metrics.cudagraph_records <= 4
    records, replays = ember.metrics.cudagraph_records, ember.metrics.cudagraph_replays
    steps(4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert ember.metrics.cudagraph_records == records
    assert ember.metrics.cudagraph_replays == replays + 8
    # activations and gradients are let go, never copied
    assert ember.metrics.cudagraph_output_copies == 0


def test_two_forwards_before_one_backward_keep_each_ones_saved_input(device):
    """Gradient accumulation: the forward saves its input for the backward, and that input lies in the
    recording's buffer; the second forward's copy-in must not overwrite what the first one saved."""
    model, ref = _mlp_and_copy(device)
    cm = _compile(model)
    for step in range(4):
        xs = [torch.randn(8, 16, device=device) for _ in range(2)]
        for m in (cm, ref):
            sum(m(x).pow(2).mean() for x in xs).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_compiled_adamw_step_with_reduce_overhead(device):
    model, ref = _mlp_and_copy(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=True)
    step = _compile(opt.step)
    for i in range(6):
        x = torch.randn(8, 16, device=device)
        for m, o, do_step in ((model, opt, step), (ref, ref_opt, ref_opt.step)):
            m(x).pow(2).mean().backward()
            do_step()
            o.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][k], ref_opt.state[q][k], rtol=1e-5, atol=1e-7)
    assert ember.metrics.cudagraph_replays >= 4


# -- memory: recordings do not own their outputs ------------------------------------------------------------

def _pool_of(runner):
    (entry,) = runner.sizes.values()
    return entry.recording.pool


def test_a_capture_goes_to_a_fresh_pool_while_replayed_outputs_are_alive():
    a, b, c = _runner(lambda x: (x + 1,)), _runner(lambda x: (x * 3,)), _runner(lambda x: (x - 2,))
    x = torch.randn(4)
    a([x]), b([x])
    kept = a([x])[0]                 # recorded: the capture's own tensor, which the allocator owns
    b([x])
    assert _pool_of(a) is _pool_of(b)
    kept_pool = _pool_of(a)
    del kept
    kept = a([x])[0]                 # replayed: a tensor over pool memory the allocator thinks is free
    assert ember.metrics.cudagraph_output_copies == 0
    c([x])                           # warm-up
    c([x])                           # runs uncaptured once, a to be recorded anew at its next call
    assert not c.sizes[()].recording and not a.sizes[()].recording
    torch.testing.assert_close(c([x])[0], x - 2)    # the pool is still dirty: c goes to a fresh one
    assert _pool_of(c) is not kept_pool
    torch.testing.assert_close(kept, x + 1)
    del kept
    assert not kept_pool.dirty()


def test_a_dropped_recording_stays_in_its_pool_while_its_outputs_are_alive():
    a = _runner(lambda x: (x + 1,), static_inputs=[0])
    x = torch.randn(4)
    for _ in range(3):
        out = a([x])[0]
        del out
    held = a([x])[0]
    old = a.sizes[()].recording
    pool = old.pool
    for _ in range(3):               # a static input that moves three times is copied: the old one is dropped
        x = torch.randn(4)
        a([x])
    assert a.sizes[()].recording is not old
    assert old in pool.prune()       # its output is alive: the pool keeps it and checks it
    del held
    assert old not in pool.prune()


def test_memory_let_go_at_a_capture_must_be_let_go_at_its_replays():
    a, b = _runner(lambda x: (x + 1,)), _runner(lambda x: (x * 3,))
    x = torch.randn(4)
    for _ in range(2):               # warm-up, then record a then b, with a's output let go
        a([x])
        b([x])
    (entry,) = b.sizes.values()
    assert entry.recording.dead_before      # b may have placed its memory where a's output was
    records = ember.metrics.cudagraph_records
    kept = a([x])[0]                 # now a's output is alive when b replays: b is recorded anew, after
    out = b([x])[0]                  # running uncaptured once while a is recorded anew with owned outputs
    assert ember.metrics.cudagraph_records == records
    torch.testing.assert_close(kept, x + 1)
    torch.testing.assert_close(out, x * 3)
    del kept, out
    for _ in range(2):
        torch.testing.assert_close(a([x])[0], x + 1)
        torch.testing.assert_close(b([x])[0], x * 3)
    assert ember.metrics.cudagraph_records == records + 2 and _pool_of(a) is _pool_of(b)


def test_a_backward_capture_lets_go_of_the_activations_it_consumes(device):
    """The runner holds none of a capture's inputs: the activations a backward frees as it runs are free for
    the rest of its capture (memory its replays then check is let go), as without CUDA graphs."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).to(device)
    cm = _compile(lambda x: torch.tanh(lin(x)).pow(2).sum())
    for _ in range(8):
        x = torch.randn(32, 64, device=device)
        loss = cm(x)
        loss.backward()
        torch.testing.assert_close(lin.weight.grad, _eager_weight_grad(lin, x))
        lin.zero_grad(set_to_none=True)
    from ember.runtime.cudagraph_memory import pools
    forward, backward = pools[str(lin.weight.device)].current.prune()[-2:]
    assert backward.consumed and {rec for rec, *_ in backward.consumed} == {forward}
    assert ember.metrics.cudagraph_replays >= 4


def _eager_weight_grad(lin, x):
    w = lin.weight.detach().clone().requires_grad_()
    torch.tanh(torch.nn.functional.linear(x, w, lin.bias.detach())).pow(2).sum().backward()
    return w.grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pool's memory is the GPU's")
def test_training_step_peak_memory_with_cuda_graphs_is_close_to_without(device):
    if device != "cuda":
        pytest.skip("real CUDA graphs")

    def peak(mode):
        torch.manual_seed(0)
        layers = [m for _ in range(6) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 8)).to(device)
        cm = torch.compile(model, backend="ember", mode=mode)
        torch._dynamo.reset()
        losses = []
        for step in range(6):
            if step == 0:       # the steps that record graphs count too
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            x = torch.randn(4096, 1024, device=device)
            loss = cm(x).pow(2).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)
            losses.append(loss.item())
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), losses

    base, ref_losses = peak(None)
    graphs, losses = peak("reduce-overhead")
    assert ember.metrics.cudagraph_replays >= 6
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    assert graphs <= 1.1 * base, (graphs, base)


def test_an_activation_held_past_the_backward_is_not_overwritten(device):
    """The forward returns a tensor it also saves for the backward. While the program lets it go before the
    backward, the backward's capture reuses its memory; once the program keeps it, that must not happen."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).to(device)

    def f(x):
        h = torch.tanh(lin(x))
        return h, (h * h).sum()

    cm = _compile(f)
    for step in range(6):
        x = torch.randn(32, 64, device=device)
        h, loss = cm(x)
        expected = torch.tanh(lin(x)).detach()
        if step < 3:
            del h
            loss.backward()
        else:
            loss.backward()
            torch.testing.assert_close(h.detach(), expected, rtol=1e-5, atol=1e-5)
        lin.zero_grad(set_to_none=True)


def test_a_backward_gradient_that_moved_after_the_warm_up_is_read_in_place_until_it_moves_again():
    r = _runner(lambda g, w: (g * w,), static_inputs=[1], settling=[0])
    w = torch.randn(8)
    r([torch.randn(8), w])                          # warm-up
    g = torch.randn(8)                              # elsewhere from now on, as after the warm-up
    for _ in range(3):
        g.normal_()
        torch.testing.assert_close(r([g, w])[0], g * w)
    (entry,) = r.sizes.values()
    assert not entry.recording.buffers and ember.metrics.cudagraph_records == 1
    for _ in range(2):                              # it moves: copied from then on
        g = torch.randn(8)
        torch.testing.assert_close(r([g, w])[0], g * w)
    assert r.copied == {0} and ember.metrics.cudagraph_records == 2
