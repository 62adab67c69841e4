"""Triton's driver built on a thread from Dynamo's start (runtime/triton_driver.py): one thread per process,
and ember's first use of the driver waits for it, so the main thread never builds a second driver."""
import threading
import time

from ember.runtime import compile_pool, triton_driver


def test_the_driver_is_built_once_on_a_thread_and_its_first_use_waits(monkeypatch):
    monkeypatch.setattr(triton_driver, "_loading", [])
    built = []

    def slow_build():
        time.sleep(0.2)
        built.append(threading.current_thread().name)
    monkeypatch.setattr(triton_driver, "_load", slow_build)
    triton_driver.load_ahead()
    triton_driver.load_ahead()              # a second graph's Dynamo start: no second thread
    assert len(triton_driver._loading) == 1 and not built
    triton_driver.ready()
    assert built == ["ember-triton-driver"]


def test_the_compile_pool_asks_for_the_target_after_the_thread(monkeypatch):
    """precompile waits for the thread before anything launches, also when it sends no job."""
    order = []
    monkeypatch.setattr(triton_driver, "_loading", [])
    monkeypatch.setattr(triton_driver, "_load", lambda: (time.sleep(0.1), order.append("built")))
    triton_driver.load_ahead()
    monkeypatch.setattr(compile_pool, "_workers", lambda: 0)
    assert compile_pool.precompile(None, None, []) == {}
    order.append("precompile returned")
    assert order == ["built", "precompile returned"]


def test_a_driver_that_cannot_be_built_ahead_is_left_to_its_first_use(monkeypatch):
    """On a machine without a GPU driver the thread logs and ends; nothing raises until the driver is used."""
    monkeypatch.setattr(triton_driver, "_loading", [])
    triton_driver.load_ahead()
    triton_driver.ready()
