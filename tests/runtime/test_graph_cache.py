"""The graph cache in one process: what its key holds, that a hit computes what a compile does (with either
wrapper), that a bad entry is a miss that recompiles, eviction, the private directory, `ember cache`.
tests/runtime/test_graph_cache_processes.py runs it across processes."""
import dataclasses
import os
import pickle

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember import cli, metrics
from ember.compile_graph import compile_graph
from ember.config import NOT_IN_PROGRAM
from ember.runtime import cache_dir, graph_key
from ember.runtime.graph_key import NotCacheable
from ember.testing import assert_close


def _mlp(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1) + x.softmax(-1).amax(-1)


def _inputs():
    return [torch.randn(8, 16), torch.randn(16, 16)]


def _compile(fn, args, **trace):
    return compile_graph(make_fx(fn, **trace)(*args), list(args))


def _check(compiled, fn, args):
    assert_close(compiled(list(args)), fn(*args))


def _entries(root) -> list:
    folder = root / "graphs"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def _key(fn, args, kind="forward", **trace):      # compile_graph's default kind
    return graph_key.graph_key(make_fx(fn, **trace)(*args), list(args), kind)


# --- the key ----------------------------------------------------------------------------------------------

def _other_value(v):
    choices = {"cpp": "triton", "triton": "cpp", "python": "fx", "fx": "python"}    # backends, wrappers
    if isinstance(v, str) and v in choices:
        return choices[v]
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "_other"
    if v is None:                     # an optional path (config.report)
        return "other.html"
    raise AssertionError(f"no other value for {v!r}")


def test_every_setting_that_changes_the_program_changes_the_key():
    args = _inputs()
    base = _key(_mlp, args)
    fields = [f.name for f in dataclasses.fields(ember.config) if f.name not in NOT_IN_PROGRAM]
    assert "fuse" in fields and "check_nans" in fields and "cpu_backend" in fields
    for name in fields:
        value = getattr(ember.config, name)
        if isinstance(value, list):       # the user's post-grad passes: callables, not cached at all
            with ember.config.patch(**{name: [lambda gm: None]}), pytest.raises(NotCacheable):
                _key(_mlp, args)
            continue
        with ember.config.patch(**{name: _other_value(value)}):
            assert _key(_mlp, args) != base, name
    for name in ("wrapper", "debug_sync", "fallback_on_error"):     # render or run time only
        with ember.config.patch(**{name: _other_value(getattr(ember.config, name))}):
            assert _key(_mlp, args) == base, name


def test_ember_source_changes_the_key(monkeypatch, tmp_path):
    args = _inputs()
    base = _key(_mlp, args)
    monkeypatch.setattr(graph_key, "ember_source_hash", lambda: "another ember")
    assert _key(_mlp, args) != base
    # the hash follows every source file's content
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = graph_key.source_hash(str(tmp_path))
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert graph_key.source_hash(str(tmp_path)) != first


def test_input_stride_dtype_and_graph_change_the_key():
    x, w = _inputs()
    base = _key(_mlp, [x, w])
    assert _key(_mlp, [x.t().contiguous().t(), w]) != base                 # same sizes, other strides
    assert _key(_mlp, [x.double(), w.double()]) != base
    assert _key(lambda a, b: _mlp(a, b) * 2, [x, w]) != base
    assert _key(lambda a, b: _mlp(a, b) * 3, [x, w]) != _key(lambda a, b: _mlp(a, b) * 2, [x, w])
    assert _key(_mlp, [x, w], kind="backward") != base
    assert _key(_mlp, [torch.randn(8, 16), torch.randn(16, 16)]) == base   # values do not count


def test_renamed_nodes_give_a_hit(cache):
    args = _inputs()
    gm = make_fx(_mlp)(*args)
    renamed = make_fx(_mlp)(*args)
    for i, n in enumerate(renamed.graph.nodes):
        if n.op != "output":
            n._rename(f"renamed_{i}")
    renamed.recompile()
    assert [n.name for n in renamed.graph.nodes] != [n.name for n in gm.graph.nodes]
    assert graph_key.graph_key(renamed, args, "forward") == graph_key.graph_key(gm, args, "forward")
    _check(compile_graph(gm, list(args)), _mlp, args)
    assert metrics.graph_cache_misses == 1 and metrics.graph_cache_hits == 0
    fresh = _inputs()
    _check(compile_graph(renamed, list(fresh)), _mlp, fresh)
    assert metrics.graph_cache_hits == 1


def test_symbolic_sizes_key_on_guards_not_on_example_sizes():
    small, large = torch.randn(8, 4), torch.randn(16, 4)
    gm = make_fx(lambda a: a.sin() + 1, tracing_mode="symbolic")(small)
    inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    base = graph_key.graph_key(gm, inputs, "forward")
    gm_large = make_fx(lambda a: a.sin() + 1, tracing_mode="symbolic")(large)
    inputs_large = [n.meta["val"] for n in gm_large.graph.nodes if n.op == "placeholder"]
    assert graph_key.graph_key(gm_large, inputs_large, "forward") == base
    env = inputs[0].shape[0].node.shape_env
    env.evaluate_expr(sympy.Gt(inputs[0].shape[0].node.expr, 4))           # a guard on the graph's symbols
    assert graph_key.graph_key(gm, inputs, "forward") != base


# --- hits -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrappers", [("python", "python"), ("python", "fx"), ("fx", "python"), ("fx", "fx")])
def test_a_hit_computes_what_a_compile_does(cache, wrappers):
    args = _inputs()
    with ember.config.patch(wrapper=wrappers[0]):
        first = _compile(_mlp, args)
    _check(first, _mlp, args)
    fallbacks, buffers = dict(metrics.fallbacks), metrics.buffers_allocated
    assert metrics.graph_cache_misses == 1 and len(_entries(cache)) == 1
    metrics.reset()
    fresh = _inputs()
    with ember.config.patch(wrapper=wrappers[1]):
        hit = _compile(_mlp, fresh)
    assert metrics.graph_cache_hits == 1 and metrics.graph_cache_misses == 0
    _check(hit, _mlp, fresh)
    assert dict(metrics.fallbacks) == fallbacks and metrics.buffers_allocated == buffers
    assert hit.kernel_count == first.kernel_count and hit.calls_aten == first.calls_aten
    if wrappers[0] == wrappers[1]:
        assert hit.source == first.source


def test_constants_are_cached_by_value(cache):
    table = torch.randn(16)

    def fn(x):
        return x * table + 1

    x = torch.randn(4, 16)
    _check(_compile(fn, [x]), fn, [x])
    fresh = torch.randn(4, 16)
    _check(_compile(fn, [fresh]), fn, [fresh])
    assert metrics.graph_cache_hits == 1
    table.add_(1)        # another constant: another graph
    _check(_compile(fn, [fresh]), fn, [fresh])
    assert metrics.graph_cache_hits == 1 and metrics.graph_cache_misses == 2


def test_guards_installed_while_compiling_are_installed_by_a_hit(cache, monkeypatch):
    from ember.graph.passes import post_grad
    run = post_grad.run

    def guarding_run(gm):
        # stands in for a decision by example size (a persistent reduction's row): a guard on s0 <= 12
        s = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder").shape[0]
        s.node.shape_env.evaluate_expr(sympy.Le(s.node.expr, 12))
        return run(gm)

    def traced(n):
        gm = make_fx(lambda a: a.cos() * 2, tracing_mode="symbolic")(torch.randn(n, 4))
        inputs = [p.meta["val"] for p in gm.graph.nodes if p.op == "placeholder"]
        return gm, inputs, inputs[0].shape[0].node.shape_env

    gm, inputs, env = traced(8)
    monkeypatch.setattr(post_grad, "run", guarding_run)
    compile_graph(gm, inputs)
    monkeypatch.setattr(post_grad, "run", run)
    assert metrics.graph_cache_misses == 1 and len(env.guards) == 1
    gm, inputs, env = traced(10)          # passes the guard: a hit, which installs it
    compiled = compile_graph(gm, inputs)
    assert metrics.graph_cache_hits == 1 and [str(g.expr) for g in env.guards] == [str(sympy.Le(
        inputs[0].shape[0].node.expr, 12))]
    x = torch.randn(10, 4)
    _check(compiled, lambda a: a.cos() * 2, [x])
    gm, inputs, env = traced(16)          # fails it: compiled anew
    compile_graph(gm, inputs)
    assert metrics.graph_cache_hits == 1 and metrics.graph_cache_misses == 2 and not env.guards


def test_uncacheable_graphs_compile_without_the_cache(cache):
    args = _inputs()
    with ember.config.patch(post_grad_passes=[lambda gm: None]):     # passes of the user's: not cached
        _check(_compile(_mlp, args), _mlp, args)
        _check(_compile(_mlp, args), _mlp, args)
    assert not _entries(cache) and metrics.graph_cache_hits == 0 and metrics.graph_cache_misses == 2
    gm = make_fx(_mlp)(*args)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = lambda *a, **k: None          # a Python function of the user's: its code is not in the key
    with pytest.raises(NotCacheable):
        graph_key.graph_key(gm, args, "forward")


# --- bad entries ------------------------------------------------------------------------------------------

def _truncate(p):
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip, lambda p: p.write_bytes(b""), lambda p: p.write_bytes(b"junk")])
def test_a_damaged_entry_is_a_miss_that_compiles(cache, damage):
    args = _inputs()
    _compile(_mlp, args)
    [entry] = _entries(cache)
    damage(entry)
    fresh = _inputs()
    _check(_compile(_mlp, fresh), _mlp, fresh)
    assert metrics.graph_cache_hits == 0 and metrics.graph_cache_misses == 2 and metrics.eager_fallbacks == 0
    _compile(_mlp, fresh)                 # rewritten whole
    assert metrics.graph_cache_hits == 1


def test_another_graphs_entry_is_a_miss(cache):
    args = _inputs()
    _compile(_mlp, args)
    other = lambda a, b: _mlp(a, b) - 1          # noqa: E731
    _compile(other, args)
    key = _key(_mlp, args)
    mine = cache / "graphs" / key[:2] / key
    [theirs] = [p for p in _entries(cache) if p != mine]
    mine.write_bytes(theirs.read_bytes())         # a whole, checksummed entry, under another key
    _check(_compile(_mlp, args), _mlp, args)
    assert metrics.graph_cache_misses == 3 and metrics.graph_cache_hits == 0


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_an_entry_that_would_run_code_is_not_loaded(cache, tmp_path):
    args = _inputs()
    _compile(_mlp, args)
    [entry] = _entries(cache)
    marker = tmp_path / "ran"
    cache_dir.write_checked(str(entry), pickle.dumps({"format": 1, "program": _Payload(str(marker))}))
    _check(_compile(_mlp, args), _mlp, args)
    assert not marker.exists()
    assert metrics.graph_cache_misses == 2 and metrics.eager_fallbacks == 0


# --- the directory ----------------------------------------------------------------------------------------

def test_the_cache_directory_is_private(cache):
    args = _inputs()
    _compile(_mlp, args)
    assert os.stat(cache).st_mode & 0o777 == 0o700
    assert _entries(cache)


def test_a_directory_others_can_write_is_not_used_for_graphs(cache):
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    args = _inputs()
    _check(_compile(_mlp, args), _mlp, args)
    assert not _entries(cache) and metrics.graph_cache_hits == 0


def test_default_root_is_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir.cache_root() == str(tmp_path / "xdg" / "ember")
    assert os.stat(tmp_path / "xdg" / "ember").st_mode & 0o777 == 0o700


def test_least_recently_used_files_are_evicted(cache):
    a, b = _inputs(), _inputs()
    other = lambda x, w: _mlp(x, w) * 2          # noqa: E731
    _compile(_mlp, a)
    [first] = _entries(cache)
    with ember.config.patch(cache_max_gb=1e-12):     # a byte: only the entry just written stays
        _compile(other, b)
    [second] = _entries(cache)
    assert second != first and not first.exists()
    fresh = _inputs()
    _check(_compile(_mlp, fresh), _mlp, fresh)       # evicted: compiled anew
    assert metrics.graph_cache_misses == 3 and metrics.graph_cache_hits == 0


def test_cache_info_and_clear(cache, capsys):
    args = _inputs()
    _compile(_mlp, args)
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "graphs" in out and "1 compiled graph" in out
    assert cli.main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert cache.exists() and not any(cache.iterdir())


def test_compile_profile_prints_a_table_per_graph(cache, capsys):
    with ember.config.patch(compile_profile=True):
        _compile(_mlp, _inputs())
        _compile(_mlp, _inputs())
    err = capsys.readouterr().err
    assert err.count("ember compile profile") == 2 and "cache miss" in err and "cache hit" in err
    for stage in ("cache lookup", "decompose", "lowering", "scheduling/fusion", "code generation", "render",
                  "kernel compile/load", "cache store"):
        assert stage in err
    assert metrics.compile_seconds > 0 and metrics.compile_stage_seconds["lowering"] > 0


def test_dynamic_shapes_through_torch_compile_hit_for_other_sizes(cache):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))

    def step(x):
        compiled = torch.compile(model, backend="ember", dynamic=True)
        model.zero_grad()
        x = x.clone().requires_grad_(True)
        out = compiled(x)
        out.backward(torch.ones_like(out))
        return [out, x.grad] + [p.grad.clone() for p in model.parameters()]

    def eager(x):
        model.zero_grad()
        x = x.clone().requires_grad_(True)
        out = model(x)
        out.backward(torch.ones_like(out))
        return [out, x.grad] + [p.grad.clone() for p in model.parameters()]

    x = torch.randn(6, 16)
    assert_close(step(x), eager(x))
    assert metrics.graph_cache_misses == 2
    torch._dynamo.reset()
    y = torch.randn(11, 16)                  # another size: the same symbolic graphs
    assert_close(step(y), eager(y))
    assert metrics.graph_cache_hits == 2 and metrics.graph_cache_misses == 2 and metrics.eager_fallbacks == 0


def test_a_hit_keeps_the_nan_checks(cache):
    def fn(x):
        return torch.log(x) * 2

    bad = torch.rand(4, 8) + 0.5
    bad[1, 2] = -1.0
    messages = []
    with ember.config.patch(check_nans=True):
        for _ in range(2):
            compiled = _compile(fn, [torch.rand(4, 8) + 0.5])
            with pytest.raises(ember.EmberNanError, match="fx nodes: mul") as e:
                compiled([bad.clone()])
            messages.append(str(e.value))
    assert metrics.graph_cache_misses == 1 and metrics.graph_cache_hits == 1
    assert messages[0] == messages[1]
