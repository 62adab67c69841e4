"""config.debug_sync: the wrapper waits for the device after every kernel and extern call, so a GPU fault
names the call that caused it."""
import torch

import ember
from torch.fx.experimental.proxy_tensor import make_fx
from ember.testing import check


def _fn(x, w):
    return torch.relu(x @ w).sum(1) + x.sum(1)        # an extern matmul, a fused kernel, a reduction


def test_debug_sync_names_each_call_and_keeps_results(device):
    x, w = torch.randn(8, 16, device=device), torch.randn(16, 16, device=device)
    with ember.config.patch(debug_sync=True):
        gm = make_fx(_fn)(x, w)
        compiled = ember.compile_graph(gm, [x, w])
        out = compiled([x, w])
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, _fn(x, w), rtol=1e-4, atol=1e-4)
    syncs = [ln for ln in compiled.source.splitlines() if "debug_sync(" in ln]     # either wrapper's rendering
    assert any("mm" in s for s in syncs), compiled.source       # the extern call is named
    assert any("kernel" in s for s in syncs), compiled.source   # and so is a generated kernel


def test_debug_sync_is_off_by_default(device):
    x, w = torch.randn(8, 16, device=device), torch.randn(16, 16, device=device)
    compiled = ember.compile_graph(make_fx(_fn)(x, w), [x, w])
    assert "debug_sync" not in compiled.source
    check(_fn, x, w)
