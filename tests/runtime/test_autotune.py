"""The autotuner on its own (the Triton interpreter on a CPU; on a GPU the whole suite runs tuned): it
picks one of the candidates, leaves written buffers as one untuned launch would, and reuses its on-disk
choice."""
import pytest
import torch
import triton
import triton.language as tl

from ember.runtime import autotune
from ember.runtime.autotune import Autotuned, KernelTuning


@triton.jit
def _add_one_in_place(in_out_ptr0, in_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_out_ptr0 + xindex, xmask)
    y = tl.load(in_ptr0 + xindex, xmask)
    tl.store(in_out_ptr0 + xindex, x + y + 1.0, xmask)


SOURCE = "add_one_in_place v1"        # the cache key stands in for the kernel's source


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    return tmp_path


def _tuned():
    cfgs = [{"XBLOCK": 64, "num_warps": 1}, {"XBLOCK": 128, "num_warps": 1}, {"XBLOCK": 32, "num_warps": 1}]
    return Autotuned(_add_one_in_place, KernelTuning(cfgs, xnumel_arg=2, tiled=False, written=[0]), SOURCE), cfgs


def test_tuning_leaves_written_buffers_as_one_launch_would(tmp_cache, device):
    k, cfgs = _tuned()
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    expected = x + y + 1.0
    k.run(x, y, 300)
    torch.testing.assert_close(x, expected)
    (chosen,) = k.best.values()
    assert chosen in cfgs
    assert list((tmp_cache / "autotune").glob("*.json"))


def test_choice_is_reused_from_disk(tmp_cache, device, monkeypatch):
    k, _ = _tuned()
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    k.run(x, y, 300)
    again, _ = _tuned()
    monkeypatch.setattr(Autotuned, "_tune", lambda *a: pytest.fail("tuned again instead of reading the cache"))
    x2 = x.clone()
    again.run(x2, y, 300)
    torch.testing.assert_close(x2, x + y + 1.0)
    assert again.best == k.best


def test_sizes_of_one_power_of_two_class_share_a_choice(tmp_cache, device):
    k, _ = _tuned()
    for n in (300, 400, 500):
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        ref = x + y + 1.0
        k.run(x, y, n)
        torch.testing.assert_close(x, ref)
    assert len(k.best) == 1
