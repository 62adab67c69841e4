"""A kernel output takes the memory of an input the kernel reads for the last time, element for element
(memory planning's in-place rule), and never when another pass of the kernel still reads that input."""
import pytest
import torch

import ember
from ember.testing import check


def _softmax_of_matmul(a, b):
    h = a @ b                                  # an extern's output, read only by the next kernel
    return torch.softmax(h, -1) @ b


@pytest.mark.parametrize("looped", [False, True])
def test_epilogue_overwrites_its_dying_input(looped, device):
    a, b = torch.randn(16, 48, device=device), torch.randn(48, 48, device=device)
    with ember.config.patch(persistent_reduction_max=16 if looped else 16384):
        check(_softmax_of_matmul, a, b)
    assert ember.metrics.in_place_buffers == 1
    assert ember.metrics.buffers_allocated == 0


def test_no_in_place_when_a_later_pass_reads_the_input(device):
    """`twice` could overwrite h element for element, but the softmax's second pass reads h after the
    pass that writes `twice`: only the softmax output, in the last pass, may take h's memory."""
    def f(a, b):
        h = a @ b
        return h * 2, torch.softmax(h, -1)
    a, b = torch.randn(16, 48, device=device), torch.randn(48, 48, device=device)
    for limit in (16, 16384):
        torch._dynamo.reset()
        ember.metrics.reset()
        with ember.config.patch(persistent_reduction_max=limit):
            check(f, a, b)
        assert ember.metrics.in_place_buffers <= 1


def test_no_in_place_through_a_transposed_read(device):
    def f(a, b):
        h = a @ b
        return h.t() + h
    a, b = torch.randn(32, 32, device=device), torch.randn(32, 32, device=device)
    check(f, a, b)
    assert ember.metrics.in_place_buffers == 0


def test_graph_inputs_are_never_overwritten(device):
    x = torch.randn(64, 64, device=device)
    before = x.clone()
    check(lambda t: (t * 2).exp(), x)
    assert torch.equal(x, before)
    assert ember.metrics.in_place_buffers == 0


def test_fusion_keeps_the_edges_between_groups_as_they_merge(device, monkeypatch):
    """Fusion updates each group's users and predecessors as groups merge; they must stay what the nodes'
    own users say, or the cycle check and the final order would read stale edges."""
    from ember.schedule import fusion
    checked = []
    real = fusion.Fusion.run

    def run(self):
        groups = real(self)
        live = [g for g in self.groups if g.alive]
        for g in live:
            from_nodes = {self.group_of[u] for n in g.nodes for u in n.users} - {g}
            assert self.users[g] == from_nodes
            assert self.preds[g] == {h for h in live if g in self.users[h]}
        checked.append(len(live))
        return groups
    monkeypatch.setattr(fusion.Fusion, "run", run)
    def fn(x, w):
        a = torch.relu(x) * 2
        b = a @ w                       # an extern call: groups before it and groups after it
        return (b.exp() + b.sin()).softmax(-1) + a.sum(-1, keepdim=True)

    check(fn, torch.randn(16, 32, device=device), torch.randn(32, 8, device=device), grad=True)
    assert checked and min(checked) >= 2


def test_a_tuned_kernel_computing_in_place_gives_one_launchs_result(device, monkeypatch, tmp_path):
    """Timing a kernel's candidates launches it many times: an output computed in place of its input must
    be restored between them (they share memory), though the kernel writes it through a plain store."""
    from ember.codegen.triton import heuristics
    from ember.codegen.triton.backend import TritonBackend
    from ember.runtime import autotune
    monkeypatch.setattr(TritonBackend, "tunes", property(lambda self: True))
    monkeypatch.setattr(heuristics, "TUNE_MIN_ELEMENTS", 0)     # tune even this small kernel
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    restored = []
    changed = autotune.changed_by_relaunch
    monkeypatch.setattr(autotune, "changed_by_relaunch", lambda *a, **k: restored.append(changed(*a, **k)) or restored[-1])
    a, b = torch.randn(16, 48, device=device), torch.randn(48, 48, device=device)
    with ember.config.patch(cpu_backend="triton", graph_cache=False):
        check(_softmax_of_matmul, a, b)
    assert ember.metrics.in_place_buffers == 1
    assert restored and all(restored)         # the softmax kernel was tuned, and its in-place output restored
