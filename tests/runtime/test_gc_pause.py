"""Python's cyclic garbage collector is paused while ember compiles and left as the program had it."""
import gc

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
