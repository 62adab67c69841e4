"""Launching a compiled Triton kernel with less host work than `kernel[grid](...)`.

Triton's JIT launch binds the arguments, computes a specialization key, looks the binary up, builds
launch metadata and queries the current device and stream on every call: ~10-20 us of host time on the
GPU machines we measure on, paid once per kernel per step, and the whole cost of small kernels (a
memory-bound kernel over 268 MB runs for ~65 us). `Launcher` pays it once per distinct specialization:
the first call goes through the JIT, which returns the compiled kernel; later calls with the same
specialization call that kernel's own launcher (`CompiledKernel.run`) directly.

The specialization key is what decides which binary Triton would pick: the current device (a binary is
loaded per device), each tensor's dtype and whether its address is 16-byte aligned (Triton specializes
pointers on that), every other argument's exact value (Triton specializes integers on ==1, divisibility
by 16 and width; keying on the value is stricter), and the launch meta (block sizes, warps). A launch hook (a profiler such as proton) or an unknown calling
convention sends every launch through the JIT, as before. (Until session 6 every launch did: Triton >= 3.4
keeps an empty HookChain where older versions kept None, and that read as "a hook is set". Measured on an
H100, Triton 3.6: 12.8 us per JIT launch.)
"""
from __future__ import annotations

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


def _hooked(hook) -> bool:
    """Is a launch hook set? Triton >= 3.4 keeps each hook as a HookChain that is always there and holds a
    list of callables (empty unless a profiler registered one); older Triton keeps None or a callable."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


def _device_and_stream():
    """The active driver's getters of the current device and of its current stream (what the JIT asks).
    The CUDA driver's device getter is `torch.cuda.current_device`, a Python function that re-checks lazy
    init on every call; once a kernel launches, CUDA is initialised and torch's C getter says the same."""
    from triton.runtime.driver import driver
    device = driver.active.get_current_device
    if device is torch.cuda.current_device:
        device = torch._C._cuda_getDevice
    return device, driver.active.get_current_stream


def _hook_probe(rt):
    """A cheap callable: is a launch hook set right now? (None when no runtime knobs exist.)"""
    if rt is None:
        return None
    return lambda: _hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook)


def _key_function(n_args: int, tensor_pos):
    """key(args) for a kernel of n_args positional arguments, generated once: each tensor's dtype and
    16-byte alignment, every other argument itself (a Python genexpr over the arguments cost ~1.5 us)."""
    parts = []
    for i in range(n_args):
        parts += [f"a[{i}].dtype", f"not a[{i}].data_ptr() & 15"] if i in tensor_pos else [f"a[{i}]"]
    scope: dict = {}
    exec(f"def key(a):\n    return ({', '.join(parts)},)\n", scope)
    return scope["key"]


class Launcher:
    """A Triton JITFunction; `launcher[grid](*args, **meta)` launches it like the JITFunction would."""

    def __init__(self, fn):
        self.fn = fn
        self.fast: dict = {}          # specialization key -> go(grid_x, grid_y, grid_z, stream, args)
        self.enabled = True
        self._n_args = None           # positional arguments per call, fixed by the first call
        self._args_key = None         # key of those arguments, generated at the first call
        self._device = self._stream = None   # the driver's getters, bound at the first launch
        self._hooks = _hook_probe(_knobs_runtime())
        self._names = [p.name for p in fn.params]
        self._constexpr = {p.name for p in fn.params if p.is_constexpr}

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launch(grid, args, meta)

    def launch(self, grid, args, meta):
        if not self.enabled or (self._hooks is not None and self._hooks()):
            return self.fn[grid](*args, **meta)
        if self._n_args is None:
            self._n_args = len(args)
            self._args_key = _key_function(len(args), {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)})
            self._device, self._stream = _device_and_stream()
        elif len(args) != self._n_args:
            return self.fn[grid](*args, **meta)
        device = self._device()
        key = (device, self._args_key(args), *meta.values())     # a binary is loaded per device
        go = self.fast.get(key)
        if go is None:
            kernel = self.fn[grid](*args, **meta)
            self._remember(key, kernel, args, meta)
            return kernel
        go(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, self._stream(device), args)

    def _remember(self, key, kernel, args, meta) -> None:
        """Keep a launch function for this key when the call can be replayed exactly: every parameter
        after the positional ones is a constexpr given in meta, and the kernel has the launcher attributes
        of Triton >= 3.0. It goes through torch's C launcher where that can take the kernel, else through
        the compiled kernel's own launcher."""
        if len(self.fast) >= _MAX_SPECIALIZATIONS or kernel is None:
            return
        rest = self._names[len(args):]
        if any(n not in self._constexpr or n not in meta for n in rest):
            self.enabled = False
            return
        run = getattr(kernel, "run", None)
        function = getattr(kernel, "function", None)
        packed = getattr(kernel, "packed_metadata", None)
        if run is None or function is None or packed is None:
            self.enabled = False
            return
        go = static_launch(kernel, len(args)) if config.static_launch else None
        if go is None:
            tail = tuple(meta[n] for n in rest)

            def go(gx, gy, gz, stream, args):
                run(gx, gy, gz, stream, function, packed, None, None, None, *args, *tail)
        self.fast[key] = go
