"""Helpers for tests (ember's and users'): compile with ember, compare with eager, outputs and grads."""
from __future__ import annotations

import copy

import torch
import torch.utils._pytree as pytree


def eager_fuses_sdpa(*args, **kwargs) -> bool:
    """Whether eager runs a fused kernel (not the math form) for these scaled_dot_product_attention
    arguments: on a GPU, float32 with grouped heads, for one, runs the math form."""
    from torch.nn.attention import SDPBackend
    return torch._fused_sdp_choice(*args, **kwargs) != SDPBackend.MATH.value


def default_tol(dtype):
    return {torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2), torch.float32: (1e-4, 1e-5),
            torch.float64: (1e-7, 1e-7)}.get(dtype, (0, 0))


def fresh_compile(fn, **kwargs):
    torch._dynamo.reset()
    return torch.compile(fn, backend="ember", **kwargs)


def _clone(args, requires_grad):
    def c(x):
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            if requires_grad and y.is_floating_point():
                y.requires_grad_(True)
            return y
        return x
    return pytree.tree_map(c, args)


def assert_close(actual, expected, rtol=None, atol=None, what="output"):
    flat_a, flat_e = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(flat_a) == len(flat_e), f"{what}: {len(flat_a)} values, eager has {len(flat_e)}"
    for i, (a, e) in enumerate(zip(flat_a, flat_e)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}[{i}]: got {type(a)}"
            assert a.shape == e.shape, f"{what}[{i}]: shape {tuple(a.shape)} vs eager {tuple(e.shape)}"
            assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} vs eager {e.dtype}"
            r, t = default_tol(e.dtype)
            torch.testing.assert_close(a, e, rtol=rtol if rtol is not None else r,
                                       atol=atol if atol is not None else t, equal_nan=True,
                                       msg=lambda m: f"{what}[{i}]: {m}")
        else:
            assert a == e, f"{what}[{i}]: {a} vs eager {e}"


def _to(tree, device):
    """tree with its tensors on device (None: tree as it is)."""
    if device is None:
        return tree
    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, tree)


def check(fn, *args, grad=False, rtol=None, atol=None, reference_device=None, **compile_kwargs):
    """Run fn eagerly and with ember on copies of args; compare outputs (and input grads if grad).
    reference_device="cpu": the eager reference runs on the CPU, for ops whose eager CUDA kernel is the
    one that is wrong (the test says which PyTorch issue)."""
    eager_args = _clone(_to(args, reference_device), grad)
    ember_args = _clone(args, grad)
    expected = fn(*eager_args)
    compiled = fresh_compile(fn, **compile_kwargs)
    actual = compiled(*ember_args)
    assert_close(_to(actual, reference_device), expected, rtol, atol)
    if grad:
        outs_e = [o for o in pytree.tree_leaves(expected) if isinstance(o, torch.Tensor) and o.requires_grad]
        outs_a = [o for o in pytree.tree_leaves(actual) if isinstance(o, torch.Tensor) and o.requires_grad]
        gens = [torch.randn_like(o) for o in outs_e]
        torch.autograd.backward(outs_e, gens)
        torch.autograd.backward(outs_a, [g.to(a.device, copy=True) for g, a in zip(gens, outs_a)])
        ge = [a.grad for a in pytree.tree_leaves(eager_args) if isinstance(a, torch.Tensor) and a.requires_grad]
        ga = [a.grad for a in pytree.tree_leaves(ember_args) if isinstance(a, torch.Tensor) and a.requires_grad]
        assert_close(_to(ga, reference_device), ge, rtol, atol, what="grad")
    return actual


class MLP(torch.nn.Module):
    """A small classifier with a loss (Linear, GELU, LayerNorm, Linear, cross-entropy): the model the
    training tests compile, forward and backward, x of shape [n, 32], t of class ids below 10."""

    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)

    def forward(self, x, t):
        h = torch.nn.functional.gelu(self.l1(x))
        return torch.nn.functional.cross_entropy(self.l2(self.ln(h)), t)


# --- for lowering tests -------------------------------------------------------------------------------------

def lowered(fn, *args, **kwargs):
    """check(), and assert the ops went through ember's lowerings: no ATen fallback, no eager graph."""
    from . import metrics
    out = check(fn, *args, **kwargs)
    assert not metrics.fallbacks, f"unexpected ATen fallbacks: {dict(metrics.fallbacks)}"
    assert metrics.eager_fallbacks == 0
    return out


def interpreter_xfail(request, device, reason):
    """Known bugs of the CPU test path (Triton interpreter), outside the lowering: strict, so the fix shows."""
    import os

    import pytest

    from .device import backend_for
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and backend_for("cpu").interpreted:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


BF16_ROUNDING = ("Triton interpreter: float32 -> bfloat16 casts (`.to(tl.bfloat16)` and stores) truncate "
                 "instead of rounding to nearest even; ember's codegen relies on them")


def randf(*shape, lo=-3.0, hi=3.0, dtype=torch.float32, device="cpu"):
    """Uniform floats in [lo, hi)."""
    return (torch.rand(shape, device=device) * (hi - lo) + lo).to(dtype)


def randi(*shape, lo=-20, hi=20, dtype=torch.int64, device="cpu", nonzero=False):
    """Uniform integers in [lo, hi), zeros replaced by ones with nonzero=True."""
    x = torch.randint(lo, hi, shape, device=device, dtype=dtype)
    if nonzero:
        x = torch.where(x == 0, torch.ones_like(x), x)
    return x


def randb(*shape, device="cpu"):
    return torch.rand(*shape, device=device) > 0.5



def peak_bytes(fn) -> int:
    """Most bytes allocated at once while fn() runs, above what was allocated when it started: CUDA's
    allocator statistics on a GPU, the profiler's record of every CPU allocation otherwise."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    events = cpu_allocations(fn)
    if not events:
        return 0
    start = events[0]["Total Allocated"] - events[0]["Bytes"]
    return max(e["Total Allocated"] for e in events) - start


def cpu_allocations(fn) -> list:
    """The profiler's record of every CPU allocation and free while fn() runs, in order: per event its
    "Bytes" (negative: freed) and the "Total Allocated" after it."""
    import json
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = sorted((e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"),
                            key=lambda e: e["ts"])
    finally:
        os.remove(path)
    return [e["args"] for e in events]


def module_step(module, x, grad_out, dtype, compiled: bool, train: bool) -> dict:
    """A copy of `module` in `dtype` run on `x` (eager or compiled by ember), as float32 tensors by name:
    the output and, where `train`, the input's and each parameter's gradient for the output gradient
    `grad_out`, then the floating buffers (BatchNorm's running statistics)."""
    m = copy.deepcopy(module).to(dtype).train(train)
    xx = x.to(dtype).detach().clone().requires_grad_(train)
    with torch.set_grad_enabled(train):
        out = (fresh_compile(m) if compiled else m)(xx)
    values = {"output": out}
    if train:
        out.backward(grad_out.to(dtype))
        values["input grad"] = xx.grad
        values.update({f"{n}.grad": p.grad for n, p in m.named_parameters()})
    values.update({n: b for n, b in m.named_buffers() if b.is_floating_point()})
    return {k: v.detach().float() for k, v in values.items()}


def precision_runs(module, x, dtype, train: bool = True) -> tuple:
    """(float32 reference, eager, ember) runs of `module` (module_step): the half-precision ones in
    `dtype`, the reference in float32 from the same weights, input and output gradient, each first
    rounded to `dtype`, so that the difference is the half-precision computation's alone."""
    module = module.to(x.device).to(dtype).float()
    x = x.to(dtype).float()
    with torch.no_grad():
        grad_out = torch.randn_like(copy.deepcopy(module).eval()(x)).to(dtype).float()
    return tuple(module_step(module, x, grad_out, d, compiled, train)
                 for d, compiled in ((torch.float32, False), (dtype, False), (dtype, True)))
