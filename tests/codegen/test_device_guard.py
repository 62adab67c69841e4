"""Triton launches a kernel on the current CUDA device, not on its tensors' device: a compiled graph whose
kernels run on one GPU makes that GPU current for the call (codegen/backends.guard_current_device)."""
import pytest
import torch

from ember.codegen import backends
from ember.codegen.wrapper.lines import DefineKernel, WrapperProgram
from ember.testing import check


class _Guard:
    """Stands in for torch.cuda._DeviceGuard (no GPU here): records which device each call made current."""
    entered: list = []

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        _Guard.entered.append(self.index)

    def __exit__(self, *exc):
        _Guard.entered.append("restored")


def _program(*devices, backend="triton"):
    kernels = [DefineKernel(f"kernel{i}", "", backend, device=torch.device(d)) for i, d in enumerate(devices)]
    return WrapperProgram([], kernels, {})


def test_a_graph_on_one_gpu_runs_with_that_gpu_current(monkeypatch):
    monkeypatch.setattr(torch.cuda, "_DeviceGuard", _Guard)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    _Guard.entered = []
    fn = backends.guard_current_device(lambda args: ("ran", list(args), list(_Guard.entered)),
                                       _program("cuda:1", "cuda:1"))
    assert fn([3]) == ("ran", [3], [1])              # cuda:1 is current while the wrapper runs
    assert _Guard.entered == [1, "restored"]         # and the previous device is back afterwards


def test_a_graph_on_the_current_gpu_skips_the_guard(monkeypatch):
    monkeypatch.setattr(torch.cuda, "_DeviceGuard", _Guard)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    _Guard.entered = []
    fn = backends.guard_current_device(lambda args: list(args), _program("cuda:1"))
    assert fn([3]) == [3] and _Guard.entered == []


def test_graphs_without_a_single_gpu_are_left_alone(monkeypatch):
    monkeypatch.setattr(torch.cuda, "_DeviceGuard", _Guard)
    call = lambda args: args                          # noqa: E731
    for program in (_program("cpu", backend="cpp"), _program("cpu", backend="triton-interpret"),
                    _program(), _program("cuda:0", "cuda:1"), _program("cuda")):
        assert backends.guard_current_device(call, program) is call


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_graph_on_the_second_gpu_while_the_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(4096, 8, device="cuda:1")
    check(lambda a: (torch.sin(a) * 2 + a.sum(0, keepdim=True),), x, grad=True)
    assert torch.cuda.current_device() == 0
