"""runtime/launch.py: after the first launch of a specialization, a Triton kernel is launched through
its compiled launcher with exactly the arguments Triton's JIT would pass; anything that could pick
another binary goes through the JIT again. The bookkeeping is checked here with a stand-in JIT function
(no GPU needed) and Triton's own launcher (torch's C launcher has tests of its own,
test_static_launch.py); on a GPU every Triton test launches through them."""
import types

import pytest
import torch

from ember.runtime import launch as launch_mod
from ember.runtime.launch import Launcher


class FakeKernel:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn-handle", "packed"

    def run(self, *a):
        self.log.append(("fast", a))


class FakeJIT:
    """Stands in for triton.JITFunction: kernel(in_ptr, out_ptr, xnumel, XBLOCK: constexpr)."""

    def __init__(self, names=("in_ptr0", "out_ptr0", "xnumel", "XBLOCK"), constexpr=("XBLOCK",)):
        self.params = [types.SimpleNamespace(name=n, is_constexpr=n in constexpr) for n in names]
        self.log, self.compiled = [], 0

    def __getitem__(self, grid):
        def jit_launch(*args, **meta):
            self.log.append(("jit", grid, args, meta))
            self.compiled += 1
            return FakeKernel(self.log)
        return jit_launch


@pytest.fixture(autouse=True)
def _triton_launcher(monkeypatch):
    monkeypatch.setattr(launch_mod, "static_launch", lambda kernel, n_args, grid_rank: None)


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(launch_mod, "_device_and_stream", lambda: (lambda: 0, lambda device: 1234))
    monkeypatch.setattr(launch_mod, "_knobs_runtime", lambda: None)
    fn = FakeJIT()
    return fn, Launcher(fn)


def test_second_launch_goes_through_the_compiled_launcher(launcher):
    fn, L = launcher
    x, y = torch.randn(64), torch.empty(64)
    L[(3, 2)](x, y, 64, XBLOCK=16, num_warps=4)
    L[(4, 2)](x, y, 64, XBLOCK=16, num_warps=4)
    assert [e[0] for e in fn.log] == ["jit", "fast"]
    # grid, stream, handle, packed metadata, no launch metadata or hooks, then every parameter in order
    # (tensors as their data pointers)
    assert fn.log[1][1] == (4, 2, 1, 1234, "fn-handle", "packed", None, None, None, x.data_ptr(), y.data_ptr(),
                            64, 16)


def test_anything_that_picks_another_binary_goes_through_the_jit(launcher):
    fn, L = launcher
    x, y = torch.randn(65), torch.empty(64)
    L[(4,)](x[:64], y, 64, XBLOCK=16)
    L[(4,)](x[1:], y, 64, XBLOCK=16)                          # misaligned pointer
    L[(4,)](x[:64].double(), y, 64, XBLOCK=16)                # another dtype
    L[(4,)](x[:64], y, 48, XBLOCK=16)                         # another size
    L[(4,)](x[:64], y, 64, XBLOCK=32)                         # another block size
    L[(4,)](x[:64], y, 64, XBLOCK=16, num_warps=8)            # another launch option
    assert [e[0] for e in fn.log] == ["jit"] * 6
    L[(4,)](x[1:], y, 64, XBLOCK=16)                          # each of them is remembered
    assert fn.log[-1][0] == "fast"


def test_unknown_calling_convention_keeps_the_jit(launcher):
    fn = FakeJIT(names=("in_ptr0", "xnumel", "XBLOCK", "RBLOCK"), constexpr=("XBLOCK", "RBLOCK"))
    L = Launcher(fn)
    for _ in range(2):
        L[(1,)](torch.randn(4), 4, XBLOCK=4)                  # RBLOCK left to a default: not replayable
    assert [e[0] for e in fn.log] == ["jit", "jit"]


def test_another_device_goes_through_the_jit(monkeypatch):
    current = [0]
    monkeypatch.setattr(launch_mod, "_device_and_stream", lambda: (lambda: current[0], lambda device: 1234))
    monkeypatch.setattr(launch_mod, "_knobs_runtime", lambda: None)
    fn = FakeJIT()
    L = Launcher(fn)
    x, y = torch.randn(64), torch.empty(64)
    L[(4,)](x, y, 64, XBLOCK=16)
    current[0] = 1                                            # the same call on another GPU
    L[(4,)](x, y, 64, XBLOCK=16)
    L[(4,)](x, y, 64, XBLOCK=16)
    assert [e[0] for e in fn.log] == ["jit", "jit", "fast"]


class HookChain:
    """Triton >= 3.4's launch hooks: always present, a list of callables inside."""
    def __init__(self, calls=()):
        self.calls = list(calls)


@pytest.mark.parametrize("hooks, fast", [((None, None), True), ((HookChain(), HookChain()), True),
                                         ((HookChain([print]), HookChain()), False),
                                         ((HookChain(), HookChain([print])), False), ((print, None), False)])
def test_launch_hooks_are_honoured_and_empty_hook_chains_are_not_hooks(monkeypatch, hooks, fast):
    rt = types.SimpleNamespace(launch_enter_hook=hooks[0], launch_exit_hook=hooks[1])
    monkeypatch.setattr(launch_mod, "_device_and_stream", lambda: (lambda: 0, lambda device: 1234))
    monkeypatch.setattr(launch_mod, "_knobs_runtime", lambda: rt)
    fn = FakeJIT()
    L = Launcher(fn)
    x, y = torch.randn(64), torch.empty(64)
    for _ in range(2):
        L[(4,)](x, y, 64, XBLOCK=16)
    assert [e[0] for e in fn.log] == (["jit", "fast"] if fast else ["jit", "jit"])


def test_a_kernel_the_c_launcher_takes_is_launched_through_it(launcher, monkeypatch):
    fn, L = launcher
    gone = []
    monkeypatch.setattr(launch_mod, "static_launch", lambda kernel, n_args, rank: lambda *a: gone.append(a))
    x, y = torch.randn(64), torch.empty(64)
    for _ in range(2):
        L[(4, 2)](x, y, 64, XBLOCK=16)
    assert [e[0] for e in fn.log] == ["jit"]
    assert gone == [((4, 2), 1234, (x.data_ptr(), y.data_ptr(), 64))]


# -- call sites: one per wrapper line, keyed without dtypes --------------------------------------------------

def _site(L, meta):
    bound = {}
    first = launch_mod.call_site(L, meta, lambda fn: bound.__setitem__("fn", fn))
    return lambda grid, *args: bound.get("fn", first)(grid, *args)


def test_a_call_site_launches_through_the_compiled_launcher_after_its_first_call(launcher):
    fn, L = launcher
    site = _site(L, {"XBLOCK": 16, "num_warps": 4})
    x, y = torch.randn(64), torch.empty(64)
    site((3, 2), x, y, 64)
    site((4, 2), x, y, 64)
    assert [e[0] for e in fn.log] == ["jit", "fast"]
    assert fn.log[0][2:] == ((x, y, 64), {"XBLOCK": 16, "num_warps": 4})
    assert fn.log[1][1] == (4, 2, 1, 1234, "fn-handle", "packed", None, None, None, x.data_ptr(), y.data_ptr(),
                            64, 16)


def test_a_call_site_keys_on_each_misaligned_pointer_and_every_other_argument(launcher):
    fn, L = launcher
    site = _site(L, {"XBLOCK": 16})
    x, y = torch.randn(72), torch.empty(72)
    site((4,), x[:64], y[:64], 64)
    site((4,), x[2:66], y[:64], 64)          # x misaligned
    site((4,), x[:64], y[2:66], 64)          # y misaligned by as much: another binary
    site((4,), x[:64], y[:64], 48)           # another size
    assert [e[0] for e in fn.log] == ["jit"] * 4
    site((4,), x[1:65], y[:64], 64)          # misaligned by another amount: keyed apart (a JIT launch)
    site((4,), x[2:66], y[:64], 64)
    site((4,), x[:64], y[:64], 48)
    site((4,), x[:64], y[:64], 64)
    assert [e[0] for e in fn.log] == ["jit"] * 5 + ["fast"] * 3


def test_a_call_site_honours_launch_hooks(monkeypatch):
    rt = types.SimpleNamespace(launch_enter_hook=HookChain([print]), launch_exit_hook=HookChain())
    monkeypatch.setattr(launch_mod, "_device_and_stream", lambda: (lambda: 0, lambda device: 1234))
    monkeypatch.setattr(launch_mod, "_knobs_runtime", lambda: rt)
    fn = FakeJIT()
    site = _site(Launcher(fn), {"XBLOCK": 16})
    x, y = torch.randn(64), torch.empty(64)
    for _ in range(2):
        site((4,), x, y, 64)
    assert [e[0] for e in fn.log] == ["jit", "jit"]


def test_a_kernel_without_a_site_is_called_as_triton_kernels_are():
    fn = FakeJIT()
    site = launch_mod.call_site(fn, {"XBLOCK": 16}, lambda f: None)
    x, y = torch.randn(64), torch.empty(64)
    site((4,), x, y, 64)
    assert fn.log == [("jit", (4,), (x, y, 64), {"XBLOCK": 16})]
