"""Whole Dynamo graphs from AOTAutograd's cache (runtime/whole_graph_cache.py): a second compile of the same
graph, after `torch._dynamo.reset()`, loads AOTAutograd's entry and ember's programs and computes what the
first compile did, forward and backward; what changes its key; where it is not used; damaged entries."""
import logging
import os
import sys

import pytest
import torch

import ember
from ember import metrics
from ember.runtime import cache_dir
from ember.testing import assert_close


class Net(torch.nn.Module):
    """Attention-free but varied: a matmul, a norm with running statistics (mutated buffers), a reduction."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 24)
        self.norm = torch.nn.BatchNorm1d(24)
        self.out = torch.nn.Linear(24, 8)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.lin(x)))
        return self.out(h).softmax(-1) * h.abs().mean(-1, keepdim=True)


def _train_step(model, x, backend="ember", **compile_kwargs):
    """Outputs, input and parameter gradients and the running statistics after one training step."""
    run = torch.compile(model, backend=backend, **compile_kwargs) if backend else model
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    out = run(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out.detach(), x.grad] + [p.grad.clone() for p in model.parameters()] + \
        [model.norm.running_mean.clone(), model.norm.running_var.clone()]


def _compiled_and_eager(x, **compile_kwargs):
    torch.manual_seed(0)
    compiled_model, eager_model = Net(), Net()
    eager_model.load_state_dict(compiled_model.state_dict())
    return _train_step(compiled_model, x, **compile_kwargs), _train_step(eager_model, x, backend=None)


def _whole_entries(root) -> list:
    folder = root / cache_dir.WHOLE
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_a_second_compile_loads_the_whole_graph_and_computes_the_same(cache):
    x = torch.randn(12, 16)
    got, want = _compiled_and_eager(x)
    assert_close(got, want)
    assert metrics.whole_graph_hits == 0 and metrics.graph_cache_misses == 2
    assert len(_whole_entries(cache)) == 1

    torch._dynamo.reset()
    y = torch.randn(12, 16)                  # fresh values, the same graph
    got, want = _compiled_and_eager(y)
    assert_close(got, want)
    assert metrics.whole_graph_hits == 1 and metrics.graph_cache_hits == 2 and metrics.graph_cache_misses == 2
    assert metrics.eager_fallbacks == 0
    # AOTAutograd's cache is ember's only while ember compiles: torch's own lookup and write are back
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    assert "iterate_over_candidates" not in AOTAutogradCache.__dict__
    assert AOTAutogradCache._write_to_local_cache.__module__ == AOTAutogradCache.__module__


def test_a_hit_does_not_build_the_decomposition_table(cache):
    """AOTAutograd reads the decompositions only when it traces: a warm start loading the whole graph skips
    building the table."""
    from ember.graph.decompose import decomposition_table
    _compiled_and_eager(torch.randn(12, 16))
    torch._dynamo.reset()
    decomposition_table.cache_clear()
    got, want = _compiled_and_eager(torch.randn(12, 16))
    assert_close(got, want)
    assert metrics.whole_graph_hits == 1 and decomposition_table.cache_info().currsize == 0


def test_inference_hits_keep_the_direct_call(cache):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(12, 16)
    with torch.no_grad():
        for round_ in range(2):
            torch._dynamo.reset()
            assert_close(torch.compile(model, backend="ember")(x), model(x))
            assert metrics.whole_graph_hits == round_ and metrics.direct_graphs == round_ + 1


@pytest.mark.parametrize("change", ["setting", "dtype", "stride", "installed versions"])
def test_what_changes_the_key_is_a_miss(cache, change, monkeypatch):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(12, 16)
    _train_step(model, x)
    torch._dynamo.reset()
    if change == "installed versions":      # what stands in for torch's and Triton's hashes of their sources
        from ember.runtime import whole_graph_cache
        versions = whole_graph_cache.installed_versions()
        monkeypatch.setattr(whole_graph_cache, "installed_versions", lambda: versions + " triton 0.0.0")
        _train_step(model, x)
    elif change == "setting":
        with ember.config.patch(persistent_reduction_max=ember.config.persistent_reduction_max * 2 + 1):
            _train_step(model, x)
    elif change == "dtype":
        _train_step(model.double(), x.double())
    else:
        _train_step(model, torch.randn(16, 12).t())
    assert metrics.whole_graph_hits == 0 and len(_whole_entries(cache)) == 2


def test_the_key_hashes_no_installed_sources(cache, monkeypatch):
    """AOTAutograd's key holds torch and Triton by their versions while ember compiles: inductor's hashes of
    their installed files (`torch_key`, and `triton_key` through `CacheBase.get_system`) are not computed, and
    are torch's own again after the compile."""
    from torch._inductor import codecache

    def unexpected():
        raise AssertionError("a hash of installed sources was computed")
    monkeypatch.setattr(codecache, "torch_key", unexpected)
    monkeypatch.setattr(codecache.CacheBase, "get_system", staticmethod(unexpected))
    for round_ in range(2):
        torch._dynamo.reset()
        got, want = _compiled_and_eager(torch.randn(12, 16))
        assert_close(got, want)
        assert metrics.whole_graph_hits == round_ and metrics.eager_fallbacks == 0
    assert len(_whole_entries(cache)) == 1
    assert codecache.torch_key is unexpected and codecache.CacheBase.get_system is unexpected


def test_not_used_with_symbolic_sizes(cache):
    torch.manual_seed(0)
    model = Net()
    for _ in range(2):
        torch._dynamo.reset()
        _train_step(model, torch.randn(12, 16), dynamic=True)
    assert metrics.whole_graph_hits == 0 and not _whole_entries(cache)
    assert metrics.graph_cache_hits == 2          # ember's own graph cache still serves them


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_entry_is_a_miss_that_compiles(cache, damage, recwarn, caplog):
    x = torch.randn(12, 16)
    _compiled_and_eager(x)
    (path,) = _whole_entries(cache)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x5A
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))
    torch._dynamo.reset()
    caplog.set_level(logging.WARNING)
    got, want = _compiled_and_eager(x)
    assert_close(got, want)
    assert metrics.whole_graph_hits == 0 and metrics.eager_fallbacks == 0
    assert not [w for w in recwarn if "ember" in str(w.message) or "cache" in str(w.message)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]     # a debug log only
    torch._dynamo.reset()
    _compiled_and_eager(x)                        # the entry was written anew
    assert metrics.whole_graph_hits == 1


def test_a_loaded_graph_that_fails_its_first_run_runs_eagerly(cache, monkeypatch):
    x = torch.randn(12, 16)
    _compiled_and_eager(x)
    torch._dynamo.reset()
    pipeline = sys.modules["ember.compile_graph"]
    assemble = pipeline._assemble

    def failing(*args, **kwargs):             # every loaded graph's first run raises
        compiled = assemble(*args, **kwargs)

        def fail(inputs):
            raise RuntimeError("a kernel failed")
        compiled.fn = fail
        return compiled

    monkeypatch.setattr(pipeline, "_assemble", failing)
    with ember.config.patch(fallback_on_error=True), pytest.warns(RuntimeWarning, match="running it eagerly"):
        got, want = _compiled_and_eager(x)
    assert_close(got, want)
    assert metrics.whole_graph_hits == 1 and metrics.eager_fallbacks == 2


def test_the_key_reads_user_triton_kernels_only_where_the_graph_calls_them(monkeypatch):
    """The key's user-Triton-kernel sources come from torch's own reader whenever a node calls such a kernel;
    a graph without any gets the empty list torch would give, without importing inductor's wrapper codegen."""
    from torch._functorch._aot_autograd import autograd_cache
    from ember.runtime import whole_graph_cache
    read = []
    monkeypatch.setattr(autograd_cache.AOTAutogradCacheDetails, "get_triton_source_codes_from_gm",
                        lambda self, gm: read.append(gm) or ["src"])
    # a "user kernel" behind aten.sin alone
    monkeypatch.setattr(torch._library.triton, "get_triton_kernels_for_op",
                        lambda name: ["kernel"] if name == "aten::sin" else [])
    replacement = {name: fn for _, name, fn in whole_graph_cache._key_patches()}["get_triton_source_codes_from_gm"]

    def graph(op):
        g = torch.fx.Graph()
        g.output(g.call_function(op, (g.placeholder("x"),)))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    outer = graph(torch.ops.aten.cos.default)
    outer.inner = graph(torch.ops.aten.sin)                  # a packet, in a graph inside the graph
    without, with_kernel = graph(torch.ops.aten.cos.default), graph(torch.ops.aten.sin.default)
    assert replacement(None, without) == [] and read == []
    assert replacement(None, with_kernel) == ["src"] and read == [with_kernel]
    assert replacement(None, outer) == ["src"] and read == [with_kernel, outer]


class Head(torch.nn.Module):
    """An LM head that returns its logits with its loss: ember's chunked cross-entropy, the logits' backward
    outside the graph (runtime/head_logits.py)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.lm_head = torch.nn.Linear(16, 37, bias=False)

    def forward(self, x, labels):
        logits = self.lm_head(torch.tanh(self.proj(x)))
        return torch.nn.functional.cross_entropy(logits.float(), labels), logits


def test_a_returned_head_loads_whole_and_keeps_its_gradient(cache):
    """A graph whose returned logits get their backward outside it loads whole on a second compile and
    gives eager's loss, logits and gradients, through the loss and through the logits alike."""
    def step(backend, x, labels):
        torch.manual_seed(0)
        model = Head()
        run = torch.compile(model, backend=backend) if backend else model
        x = x.clone().requires_grad_(True)
        loss, logits = run(x, labels)
        (loss + logits.pow(2).mean()).backward()
        return [loss.detach(), logits.detach(), x.grad] + [p.grad for p in model.parameters()]

    for round_ in range(2):
        torch._dynamo.reset()
        x, labels = torch.randn(24, 16), torch.randint(0, 37, (24,))
        assert_close(step("ember", x, labels), step(None, x, labels))
        assert metrics.whole_graph_hits == round_ and metrics.deferred_head_logits == round_ + 1
    assert metrics.eager_fallbacks == 0
