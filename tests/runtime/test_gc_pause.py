"""Python's cyclic garbage collector is paused while ember compiles and left as the program had it."""
import gc

import pytest
import torch

import ember
from ember.runtime.gc_pause import gc_paused
from ember.testing import check


def test_paused_inside_and_restored_after_even_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():               # nested: the outer block's pause holds
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with gc_paused():
            raise ValueError
    except ValueError:
        pass
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_compiling_pauses_the_collector_and_restores_it(device, monkeypatch):
    import importlib
    compile_module = importlib.import_module("ember.compile_graph")
    seen = []
    real = compile_module._generate

    def generate(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)
    monkeypatch.setattr(compile_module, "_generate", generate)
    with ember.config.patch(graph_cache=False):
        check(lambda x, w: torch.nn.functional.gelu(x @ w).sum(-1), torch.randn(8, 16, device=device),
              torch.randn(16, 4, device=device), grad=True)
    assert seen == [False, False]        # forward and backward compiled with the collector paused
    assert gc.isenabled()


def _collector_during_dynamo(backend, fn, x):
    """Whether the collector ran during Dynamo's compile of `fn` for `backend` (seen by a start callback
    that runs after ember's), and after it."""
    from torch._dynamo.callback import callback_handler
    from ember import dynamo
    torch._dynamo.reset()
    dynamo._install_compile_callbacks()
    seen = []

    def record(args):
        seen.append(gc.isenabled())
    callback_handler.register_start_callback(record)
    try:
        torch.compile(fn, backend=backend)(x)
    finally:
        callback_handler.remove_start_callback(record)
        torch._dynamo.reset()
    return seen, gc.isenabled()


def test_dynamo_traces_a_frame_for_ember_with_the_collector_paused():
    during, after = _collector_during_dynamo("ember", lambda x: torch.sin(x) * 2, torch.randn(8))
    assert during == [False] and after


def test_dynamo_traces_for_another_backend_with_the_collector_running():
    during, after = _collector_during_dynamo("aot_eager", lambda x: torch.sin(x) * 2, torch.randn(8))
    assert during == [True] and after


def test_the_collector_runs_again_after_a_compile_that_raises(monkeypatch):
    from ember import dynamo

    def fails(gm, example_inputs):
        raise RuntimeError("a backend failure")
    monkeypatch.setattr(dynamo, "_compiling_for_ember", lambda: True)     # this backend stands for ember's
    with pytest.raises(Exception, match="a backend failure"):
        _collector_during_dynamo(fails, lambda x: torch.cos(x) + 1, torch.randn(8))
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off_after_dynamo():
    gc.disable()
    try:
        during, after = _collector_during_dynamo("ember", lambda x: torch.tanh(x) - 1, torch.randn(8))
        assert during == [False] and not after
    finally:
        gc.enable()
