"""Reductions and scans over a symbolic row length in Triton kernels: a row whose example length is under
the limit is held whole (persistent), under a guard that it stays under it, with RBLOCK chosen at launch
from the row's length. One compile serves every length under the limit, in any power-of-two class; the
first length above it recompiles once (the guard), into a looped kernel that serves every length.

Every test runs the Triton kernels (the interpreter on a CPU) whatever the CPU backend, and compares
outputs (and float32 gradients) with eager on fresh random inputs."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.codegen.triton import heuristics
from ember.testing import assert_close
from tests.test_dynamic import assert_compiles, compile_counted

UNDER = (7, 33, 100, 1000, 1023, 4097)       # several power-of-two classes; 1000 and 1023 share one


@pytest.fixture(autouse=True)
def _triton(tmp_path):
    with ember.config.patch(cpu_backend="triton", debug=True, debug_dir=str(tmp_path)):
        yield


def _dump(tmp_path, graph: int, name: str) -> str:
    """A file of the test's graph number `graph` (in compile order) from ember's debug dump."""
    dirs = sorted((p for p in tmp_path.iterdir() if p.name.startswith("graph_")),
                  key=lambda p: int(p.name.split("_")[1]))
    return (dirs[graph] / name).read_text()


def _kernels(tmp_path, graph: int = 0) -> str:
    return _dump(tmp_path, graph, "kernels.py")


def _wrapper(tmp_path, graph: int = 0) -> str:
    return _dump(tmp_path, graph, "wrapper.py")


def _row_kernels(source: str) -> list:
    """The kernels with an r axis (reductions, scans)."""
    return [k for k in source.split("@triton.jit")[1:] if "rnumel" in k.split(")")[0]]


def _row_ops(x, w, b):
    n = x.shape[-1]
    return (torch.softmax(x, -1), F.layer_norm(x, (n,), w, b), x.sum(-1), x.amax(-1), torch.log_softmax(x, -1))


def _params(n, device):
    return torch.randn(n, device=device), torch.randn(n, device=device)


@torch.no_grad()
def test_symbolic_rows_compile_once_under_the_limit(device, tmp_path):
    compiled, counter = compile_counted(_row_ops)
    for n in UNDER:
        x = torch.randn(3, n, device=device)
        w, b = _params(n, device)
        assert_close(compiled(x, w, b), _row_ops(x, w, b), 1e-4, 1e-4, what=f"n={n}")
    assert_compiles(counter, 1)
    kernels = _row_kernels(_kernels(tmp_path))
    assert kernels and all("for roffset" not in k for k in kernels), "a reduction over the row is looped"


@torch.no_grad()
def test_softmax_kernel_is_persistent_with_rblock_at_launch(device, tmp_path):
    def fn(x):
        return torch.softmax(x, -1)
    compiled, counter = compile_counted(fn)
    for n in (5, 300, 17):
        x = torch.randn(4, n, device=device)
        assert_close(compiled(x), fn(x), 1e-5, 1e-6, what=f"n={n}")
    assert_compiles(counter, 1)
    (kernel,) = _row_kernels(_kernels(tmp_path))
    assert "for roffset" not in kernel and "rindex = rbase" in kernel
    # the launcher picks RBLOCK per size class: the wrapper fixes no grid or block size (Python wrapper:
    # kernel0.run(...); FX wrapper: launch_kernel(kernel0, None, ...))
    wrapper = _wrapper(tmp_path)
    assert re.search(r"kernel\d+\w*\.run\(|launch_kernel\(kernel\d+\w*, None,", wrapper), wrapper
    assert "RBLOCK" not in wrapper


@torch.no_grad()
def test_automatic_dynamic_after_a_second_length(device, tmp_path):
    compiled, counter = compile_counted(_row_ops, dynamic=None)
    for n in UNDER:
        x = torch.randn(3, n, device=device)
        w, b = _params(n, device)
        assert_close(compiled(x, w, b), _row_ops(x, w, b), 1e-4, 1e-4, what=f"n={n}")
    assert_compiles(counter, 2)       # the first length static, then one dynamic graph for all
    kernels = _row_kernels(_kernels(tmp_path, graph=1))
    assert kernels and all("for roffset" not in k for k in kernels)


@torch.no_grad()
def test_a_length_above_the_limit_recompiles_once(device, tmp_path):
    with ember.config.patch(persistent_reduction_max=64):
        compiled, counter = compile_counted(_row_ops)
        for n in (7, 33, 64):
            x = torch.randn(3, n, device=device)
            w, b = _params(n, device)
            assert_close(compiled(x, w, b), _row_ops(x, w, b), 1e-4, 1e-4, what=f"n={n}")
        assert_compiles(counter, 1)
        for n in (65, 1000, 4097, 50, 2, 130):
            x = torch.randn(3, n, device=device)
            w, b = _params(n, device)
            assert_close(compiled(x, w, b), _row_ops(x, w, b), 1e-4, 1e-4, what=f"n={n}")
        assert_compiles(counter, 2)
    first, second = _row_kernels(_kernels(tmp_path, 0)), _row_kernels(_kernels(tmp_path, 1))
    assert all("for roffset" not in k for k in first)
    assert all("for roffset" in k for k in second), "a row longer than the limit is held whole"


@torch.no_grad()
def test_a_first_length_above_the_limit_is_looped_without_a_guard(device, tmp_path):
    with ember.config.patch(persistent_reduction_max=64):
        compiled, counter = compile_counted(_row_ops)
        for n in (100, 7, 4097, 64):
            x = torch.randn(3, n, device=device)
            w, b = _params(n, device)
            assert_close(compiled(x, w, b), _row_ops(x, w, b), 1e-4, 1e-4, what=f"n={n}")
        assert_compiles(counter, 1)
    assert all("for roffset" in k for k in _row_kernels(_kernels(tmp_path)))


def _grads(fn, x, *params):
    """fn's output and the float32 gradients of x and params for a random output gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, *params)]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    torch.manual_seed(len(x.shape) + x.shape[-1])
    torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    return [o.detach() for o in outs], [t.grad for t in leaves]


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm"])
def test_gradients(device, name, tmp_path):
    fns = {"softmax": lambda x: torch.softmax(x, -1),
           "log_softmax": lambda x: torch.log_softmax(x, -1),
           "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)}
    fn = fns[name]
    compiled, counter = compile_counted(fn)
    for n in (7, 100, 1023, 1000, 4097):
        x = torch.randn(3, n, device=device)
        args = (x, *_params(n, device)) if name == "layer_norm" else (x,)
        out_e, grads_e = _grads(fn, *args)
        out_c, grads_c = _grads(compiled, *args)
        assert_close(out_c, out_e, 1e-4, 1e-4, what=f"n={n}")
        assert_close(grads_c, grads_e, 1e-4, 1e-4, what=f"grads n={n}")
    assert_compiles(counter, 1, training=True)
    assert all("for roffset" not in k for k in _row_kernels(_kernels(tmp_path)))    # the forward


def test_gradients_above_the_limit(device):
    def fn(x):
        return torch.log_softmax(x, -1)
    with ember.config.patch(persistent_reduction_max=64):
        compiled, counter = compile_counted(fn)
        for n in (7, 64, 65, 300):
            x = torch.randn(2, n, device=device)
            out_e, grads_e = _grads(fn, x)
            out_c, grads_c = _grads(compiled, x)
            assert_close(out_c, out_e, 1e-4, 1e-4, what=f"n={n}")
            assert_close(grads_c, grads_e, 1e-4, 1e-4, what=f"grads n={n}")
        assert_compiles(counter, 2, training=True)


def _scan_tol(n):
    return {"rtol": max(1e-4, 1e-5 * math.sqrt(n)), "atol": max(1e-5, 1e-5 * math.sqrt(n))}


@torch.no_grad()
def test_cumsum_over_a_symbolic_length(device, tmp_path):
    def fn(x):
        return x.cumsum(-1), (x * 0.1).exp().cumsum(-1) * 2
    compiled, counter = compile_counted(fn)
    for n in (7, 33, 100, 1000, 1023):       # under the persistent scan's limit
        x = torch.randn(3, n, device=device)
        assert_close(compiled(x), fn(x), **_scan_tol(n), what=f"n={n}")
    assert_compiles(counter, 1)
    kernels = _row_kernels(_kernels(tmp_path))
    assert kernels and all("for roffset" not in k and "associative_scan" in k for k in kernels)
    n = 4 * heuristics.PERSISTENT_SCAN_MAX + 1     # above it: the guard recompiles once, into a looped scan
    for m in (n, 50, 2 * n):
        x = torch.randn(3, m, device=device)
        assert_close(compiled(x), fn(x), **_scan_tol(m), what=f"n={m}")
    assert_compiles(counter, 2)
    assert all("for roffset" in k for k in _row_kernels(_kernels(tmp_path, 1)))


def test_cumsum_gradient(device):
    def fn(x):
        return torch.cumsum(x, -1)
    compiled, counter = compile_counted(fn)
    for n in (9, 100, 513):
        x = torch.randn(3, n, device=device)
        out_e, grads_e = _grads(fn, x)
        out_c, grads_c = _grads(compiled, x)
        assert_close(out_c, out_e, **_scan_tol(n), what=f"n={n}")
        assert_close(grads_c, grads_e, **_scan_tol(n), what=f"grads n={n}")
    assert_compiles(counter, 1, training=True)


def _run_declared_range(fn, lengths, device):
    """fn over rows of these lengths, declared dynamic in [2, 1000] (mark_dynamic): one compile, eager's values."""
    compiled, counter = compile_counted(fn, dynamic=None)
    for n in lengths:
        x = torch.randn(3, n, device=device)
        torch._dynamo.mark_dynamic(x, 1, min=2, max=1000)
        assert_close(compiled(x), fn(x), 1e-5, 1e-5, what=f"n={n}")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_a_declared_range_above_the_limit_is_not_narrowed(device, tmp_path):
    # mark_dynamic(min=, max=) declares the lengths the graph must serve: a guard below max would be
    # a constraint violation (an error from Dynamo), so the row stays looped
    def fn(x):
        return torch.softmax(x, -1), x.sum(-1)
    with ember.config.patch(persistent_reduction_max=64):
        _run_declared_range(fn, (7, 33, 200), device)
    assert all("for roffset" in k for k in _row_kernels(_kernels(tmp_path)))


@torch.no_grad()
def test_a_declared_range_under_the_limit_is_persistent(device, tmp_path):
    def fn(x):
        return torch.softmax(x, -1)
    _run_declared_range(fn, (7, 900, 33), device)
    assert all("for roffset" not in k for k in _row_kernels(_kernels(tmp_path)))


@torch.no_grad()
def test_a_data_dependent_length_is_looped(device, tmp_path):
    def fn(x, m):
        g = x[:, m]                   # (rows, u0): u0 depends on the data, no example value to guard
        return torch.softmax(g, -1), g.sum(-1)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled, counter = compile_counted(fn)
        for n in (6, 40, 9):
            x, m = torch.randn(3, n, device=device), torch.rand(n, device=device) > 0.3
            m[0] = True
            assert_close(compiled(x, m), fn(x, m), 1e-5, 1e-5, what=f"n={n}")
        assert_compiles(counter, 1)
    kernels = [k for k in _row_kernels(_kernels(tmp_path)) if "tl.sum" in k or "tl.reduce" in k]
    assert kernels and all("for roffset" in k for k in kernels)
