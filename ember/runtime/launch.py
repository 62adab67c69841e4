"""Launching a compiled Triton kernel with less host work than `kernel[grid](...)`.

Triton's JIT launch binds the arguments, computes a specialization key, looks the binary up, builds
launch metadata and queries the current device and stream on every call: more host time than a small
kernel runs, paid once per kernel per step (docs/performance.md, "One launch, piece by piece";
`python -m experiments.launch_probe`). `Launcher` pays it once per distinct specialization:
the first call goes through the JIT, which returns the compiled kernel; later calls with the same
specialization call a launch function remembered for it: torch's C launcher given the compiled function
(runtime/static_launch.py), or the compiled kernel's own launcher (`CompiledKernel.run`). The path from
`launch(grid, args, meta)` to that function is generated per kernel at its first call (`_hot_path`).

The specialization key is what decides which binary Triton would pick: the current device (a binary is
loaded per device), each tensor's dtype and whether its address is 16-byte aligned (Triton specializes
pointers on that), every other argument's exact value (Triton specializes integers on ==1, divisibility
by 16 and width; keying on the value is stricter), the grid's rank and the launch meta (block sizes,
warps). A launch hook (a profiler such as proton) or an unknown calling convention sends every launch
through the JIT, as a first call does. A hook counts as set only when it would run something: Triton >= 3.4 keeps an
empty HookChain where older versions keep None (`_hook_test`).
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import config
from .static_launch import static_launch

_MAX_SPECIALIZATIONS = 64       # sizes of a dynamic graph vary; past this many, launch through the JIT


def _knobs_runtime():
    try:
        from triton import knobs
        return knobs.runtime
    except (ImportError, AttributeError):      # Triton before knobs: no launch hooks to honour here
        return None


def _hook_test(rt) -> str:
    """A Python expression over `rt` (Triton's runtime knobs) and the hooks set now, `E` and `X`: true when
    a launch hook is set at the time it is evaluated. Triton >= 3.4 keeps each hook as a HookChain that is
    always there and holds a list of callables (empty unless a profiler registered one); older Triton
    keeps None or a callable. A hook object replaced since counts as set."""
    if rt is None:
        return "False"
    parts = []
    for name, var in (("launch_enter_hook", "E"), ("launch_exit_hook", "X")):
        hook = getattr(rt, name, None)
        if hook is None:
            parts.append(f"rt.{name} is not None")
        elif isinstance(getattr(hook, "calls", None), list):
            parts += [f"rt.{name} is not {var}", f"{var}.calls"]
        else:
            return "True"
    return " or ".join(parts)


def _device_and_stream():
    """The active driver's getters of the current device and of its current stream (what the JIT asks).
    The CUDA driver's device getter is `torch.cuda.current_device`, a Python function that re-checks lazy
    init on every call; once a kernel launches, CUDA is initialised and torch's C getter says the same."""
    from triton.runtime.driver import driver
    device = driver.active.get_current_device
    if device is torch.cuda.current_device:
        device = torch._C._cuda_getDevice
    return device, driver.active.get_current_stream


def _hot_path(launcher: "Launcher", n_args: int, tensor_pos) -> Callable:
    """launch(grid, args, meta) for calls of n_args positional arguments, generated once: the hook test, then
    the specialization key inline (each tensor's dtype and 16-byte alignment, every other argument
    itself, the grid's rank, the meta) and the launch function remembered for it. One frame a launch: a
    Python genexpr for the key, or a key function and a hook probe of their own, would each add frames of
    host time to every launch (docs/performance.md, "Host time per call")."""
    parts = []
    for i in range(n_args):
        parts += [f"a[{i}].dtype", f"not a[{i}].data_ptr() & 15"] if i in tensor_pos else [f"a[{i}]"]
    rt = _knobs_runtime()
    device, stream = _device_and_stream()
    scope = {"rt": rt, "E": getattr(rt, "launch_enter_hook", None), "X": getattr(rt, "launch_exit_hook", None),
             "device": device, "stream": stream, "fast": launcher.fast, "jit": launcher.jit_launch,
             "miss": launcher.first_launch}
    exec(f"def launch(grid, a, meta):\n"
         f"    if len(a) != {n_args} or {_hook_test(rt)}:\n"
         f"        return jit(grid, a, meta)\n"
         f"    d = device()\n"
         f"    key = (d, len(grid), {''.join(p + ', ' for p in parts)}*meta.values())\n"
         f"    go = fast.get(key)\n"
         f"    if go is None:\n"
         f"        return miss(key, grid, a, meta)\n"
         f"    go(grid, stream(d), a)\n", scope)
    return scope["launch"]


class Launcher:
    """A Triton JITFunction; `launcher[grid](*args, **meta)` and `launcher.launch(grid, args, meta)` launch it
    like the JITFunction would."""

    def __init__(self, fn):
        self.fn = fn
        self.fast: dict = {}          # specialization key -> go(grid, stream, args)
        self._names = [p.name for p in fn.params]
        self._constexpr = {p.name for p in fn.params if p.is_constexpr}

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launch(grid, args, meta)

    def launch(self, grid, args, meta):
        """The first call binds the hot path (an instance attribute from then on) and launches through it."""
        tensors = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        self.launch = _hot_path(self, len(args), tensors)
        return self.launch(grid, args, meta)

    def jit_launch(self, grid, args, meta):
        return self.fn[grid](*args, **meta)

    def first_launch(self, key, grid, args, meta):
        """A specialization not seen yet: launch through the JIT, then keep a launch function for it when
        the call can be replayed exactly: every parameter after the positional ones is a constexpr given
        in meta, and the kernel has the launcher attributes of Triton >= 3.0. The launch function goes
        through torch's C launcher where that can take the kernel, else through the compiled kernel's own
        launcher. A call that cannot be replayed sends this kernel's launches through the JIT for good."""
        kernel = self.fn[grid](*args, **meta)
        if len(self.fast) >= _MAX_SPECIALIZATIONS or kernel is None:
            return kernel
        rest = self._names[len(args):]
        run = getattr(kernel, "run", None)
        function = getattr(kernel, "function", None)
        packed = getattr(kernel, "packed_metadata", None)
        if any(n not in self._constexpr or n not in meta for n in rest) or None in (run, function, packed):
            self.launch = self.jit_launch
            return kernel
        go = static_launch(kernel, len(args), len(grid)) if config.static_launch else None
        if go is None:
            tail, pad = tuple(meta[n] for n in rest), (1,) * (3 - len(grid))

            def go(grid, stream, args):
                run(*grid, *pad, stream, function, packed, None, None, None, *args, *tail)
        self.fast[key] = go
        return kernel
