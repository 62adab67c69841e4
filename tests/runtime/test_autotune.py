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


@triton.jit
def _row_sum(in_ptr0, out_ptr0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    mask = (xindex < xnumel) & (rindex < rnumel)
    x = tl.load(in_ptr0 + (rindex + rnumel * xindex), mask, other=0)
    tl.store(out_ptr0 + xindex, tl.sum(x, 1)[:, None], xindex < xnumel)


def test_rblock_follows_the_row_length(tmp_cache, device):
    """A persistent reduction over a symbolic row: each size class gets configs whose RBLOCK holds its row."""
    from ember.codegen.triton.heuristics import RowSizedConfigs, next_pow2
    configs_for = RowSizedConfigs(contiguous=True, scan=False, tune=True)
    k = Autotuned(_row_sum, KernelTuning(configs_for(3, 7), xnumel_arg=2, tiled=False, written=[1],
                                         configs_for=configs_for), "row_sum v1")
    for n in (7, 5, 33, 1000, 1023, 4097):
        x = torch.randn(3, n, device=device)
        out = torch.empty(3, device=device)
        k.run(x, out, 3, n)
        torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)
        assert all(c["RBLOCK"] == next_pow2(n) for c in configs_for(3, n))
    assert sorted(c["RBLOCK"] for c in k.best.values()) == [8, 64, 1024, 8192]
    assert not list(tmp_cache.glob("autotune/*.json"))     # one candidate per class: nothing timed or stored


def test_row_sized_candidates_to_time():
    from ember.codegen.triton.heuristics import RowSizedConfigs, persistent_config
    big = RowSizedConfigs(contiguous=True, scan=False, tune=True)(4096, 3000)
    assert big[0] == persistent_config(4096, 4096, True, False) and len(big) > 1
    assert all(c["RBLOCK"] == 4096 and c["XBLOCK"] * c["RBLOCK"] <= 32768 for c in big)
    assert RowSizedConfigs(contiguous=True, scan=False, tune=False)(4096, 3000) == big[:1]
    scan = RowSizedConfigs(contiguous=True, scan=True, tune=True)(4096, 1000)
    assert all(c["RBLOCK"] == 1024 and c["XBLOCK"] * 1024 <= 8192 for c in scan)


def test_candidates_are_timed_outside_the_callers_dispatch_modes():
    """A first run can happen under a dispatch mode (AOTAutograd analyzes custom ops in one), which would
    charge a library candidate's ATen calls with Python's dispatch cost: timing runs with the modes off."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(64)
    timed = []

    def time(cand):
        timed.append(torch.mm(x[:8].view(2, 4), x[8:16].view(4, 2)).sum().item() + cand)
        return float(cand)
    with Seen():
        best = autotune.fastest([3, 1, 2], time, [x], [0], "test")
    assert best == 1 and len(timed) == 3
    assert torch.ops.aten.mm.default not in Seen.ops


@triton.jit
def _add_one(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) + 1.0, xmask)


def test_only_outputs_a_relaunch_changes_are_copied_while_timing(tmp_cache, device, monkeypatch):
    """A pure output is written again by the chosen launch, so timing candidates copies none of it (a
    logits-sized output's copy was GPT-2's first-call peak); an output read back, or computed in place of
    an input (sharing its memory), is restored, and each result is the one launch's."""
    cfgs = [{"XBLOCK": 64, "num_warps": 1}, {"XBLOCK": 128, "num_warps": 1}, {"XBLOCK": 32, "num_warps": 1}]
    cloned = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: cloned.append(t.numel()) or real_clone(t, *a, **k))

    pure = Autotuned(_add_one, KernelTuning(cfgs, xnumel_arg=2, tiled=False, written=[1], read_back=[]), "pure v1")
    x, out = torch.randn(300, device=device), torch.randn(300, device=device)
    pure.run(x, out, 300)
    torch.testing.assert_close(out, x + 1.0)
    assert cloned == []

    in_place = Autotuned(_add_one, KernelTuning(cfgs, xnumel_arg=2, tiled=False, written=[1], read_back=[]),
                         "in place v1")
    y = torch.randn(300, device=device)
    expected = y + 1.0
    in_place.run(y, y, 300)                   # output computed in place of its input
    torch.testing.assert_close(y, expected)
    assert cloned == [300]

    assert autotune.changed_by_relaunch([x, out, 3], [1]) == [1]                  # no read_back: all written
    assert autotune.changed_by_relaunch([x, out, 3], [1], read_back=[]) == []
    assert autotune.changed_by_relaunch([x, x[10:], 3], [1], read_back=[]) == [1]  # a view of its input


def test_generated_kernels_name_the_outputs_they_read_back():
    """The code generator says which written arguments the kernel also reads: an in-out pointer and an
    atomic add's target count, a plain store does not."""
    from ember.codegen.kernel import ArgRegistry
    args = ArgRegistry()
    args.input("a")
    args.output("a")                          # read, then written: one in_out pointer
    args.output("b")
    args.accumulate("c")
    args.pointer("d", read=True, written=True)
    assert args.read_back() == {"a", "c", "d"}
