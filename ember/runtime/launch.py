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

A warm start does not need the JIT even for the first call: where the compile workers built a kernel's
binary for the call (runtime/compile_pool.py), the Launcher holds what launching it takes, and its first
call with the arguments the binary was built for loads the binary through torch's C launcher
(`static_launch.load_binary`) instead of asking the JIT, which would hash the kernel's source and its
dependencies, compute its cache key and read the binary back through Triton's cache.

A generated wrapper calls each kernel from a call site of its own (`call_site`): one function per line of
the wrapper, `site(grid, *args)`, generated at its first call for that line's arguments and meta. Its key is
shorter: the wrapper fixes each argument's dtype when it is compiled (Dynamo guards its inputs' dtypes, and
its own buffers have the dtypes it planned, as in inductor's launchers), so the key is the device, whether
any pointer is misaligned (and then each pointer's misalignment) and the other arguments. Each pointer is
read once and passed to the launch function as an integer. Six tensors and two integers cost 1.5 us of
Python through a call site against 3.3 through `launcher[grid](...)` on the CPU box (`python -m
experiments.launch_probe --cpu`).
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from .. import config, metrics
from . import triton_driver
from .compile_pool import config_key
from .static_launch import load_binary, static_launch

log = logging.getLogger("ember")

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
    driver = triton_driver.active()
    device = driver.get_current_device
    if device is torch.cuda.current_device:
        device = torch._C._cuda_getDevice
    return device, driver.get_current_stream


def _hot_path(launcher: "Launcher", n_args: int, tensor_pos) -> Callable:
    """launch(grid, args, meta) for calls of n_args positional arguments, generated once: the hook test, then
    the specialization key inline (each tensor's dtype and 16-byte alignment, every other argument
    itself, the grid's rank, the meta) and the launch function remembered for it. One frame a launch: a
    Python genexpr for the key, or a key function and a hook probe of their own, would each add frames of
    host time to every launch (docs/performance.md, "Host time per call")."""
    parts, passed = [], []
    for i in range(n_args):
        parts += [f"a[{i}].dtype", f"not p{i} & 15"] if i in tensor_pos else [f"a[{i}]"]
        passed.append(f"p{i}" if i in tensor_pos else f"a[{i}]")
    pointers = "".join(f"    p{i} = a[{i}].data_ptr()\n" for i in sorted(tensor_pos))
    scope = _scope(launcher.fast, launcher.jit_launch, launcher.first_launch)
    exec(f"def launch(grid, a, meta):\n"
         f"    if len(a) != {n_args} or {scope['hooks']}:\n"
         f"        return jit(grid, a, meta)\n"
         f"    d = device()\n"
         f"{pointers}"
         f"    key = (d, len(grid), {''.join(p + ', ' for p in parts)}*meta.values())\n"
         f"    go = fast.get(key)\n"
         f"    if go is None:\n"
         f"        return miss(key, grid, a, meta)\n"
         f"    go(grid, stream(d), ({''.join(p + ', ' for p in passed)}))\n", scope)
    return scope["launch"]


def _scope(fast: dict, jit: Callable, miss: Callable) -> dict:
    """What a generated launch path refers to: the launch functions by key, the JIT and miss paths, the
    device and stream getters, Triton's runtime knobs and its hooks now (`hooks`: the test of them)."""
    rt = _knobs_runtime()
    device, stream = _device_and_stream()
    return {"rt": rt, "E": getattr(rt, "launch_enter_hook", None), "X": getattr(rt, "launch_exit_hook", None),
            "device": device, "stream": stream, "fast": fast, "jit": jit, "miss": miss, "hooks": _hook_test(rt)}


def _site_path(launcher: "Launcher", n_args: int, tensor_pos, meta: dict) -> Callable:
    """site(grid, a0, ...) for one wrapper line (module docstring): the key is the device, 0 when every
    pointer is 16-byte aligned (else each pointer's low bits) and the arguments that are not tensors."""
    fast: dict = {}
    names = [f"a{i}" for i in range(n_args)]
    ptrs = [f"p{i}" for i in sorted(tensor_pos)]
    others = [f"a{i}" for i in range(n_args) if i not in tensor_pos]
    passed = [f"p{i}" if i in tensor_pos else f"a{i}" for i in range(n_args)]
    misaligned = f"({' | '.join(ptrs)}) & 15 and ({''.join(p + ' & 15, ' for p in ptrs)})" if ptrs else "0"
    args = f"({''.join(n + ', ' for n in names)})"

    def miss(key, grid, args):
        kernel = None
        go = launcher.preloaded(key[0], len(grid), args, meta) if not key[1] else None
        if go is None:
            kernel = launcher.fn[grid](*args, **meta)
            go = launcher.bound(kernel, len(args), len(grid), meta)
        else:
            go(grid, scope["stream"](key[0]), _pointers(args))
        if go is not None and len(fast) < _MAX_SPECIALIZATIONS:
            fast[key] = go
        return kernel

    scope = _scope(fast, launcher.jit_launch, miss)
    scope["meta"] = meta
    exec(f"def site(grid, {', '.join(names)}):\n"
         f"    if {scope['hooks']}:\n"
         f"        return jit(grid, {args}, meta)\n"
         f"    d = device()\n"
         f"{''.join(f'    {p} = a{p[1:]}.data_ptr()' + chr(10) for p in ptrs)}"
         f"    key = (d, {misaligned}, {''.join(o + ', ' for o in others)})\n"
         f"    go = fast.get(key)\n"
         f"    if go is None:\n"
         f"        return miss(key, grid, {args})\n"
         f"    go(grid, stream(d), ({''.join(p + ', ' for p in passed)}))\n", scope)
    return scope["site"]


def call_site(kernel, meta: dict, rebind: Callable[[Callable], None]) -> Callable:
    """`site(grid, *args)` launching `kernel` with `meta` for one line of a generated wrapper: a kernel's own
    `site(meta, rebind)` where it has one (ember's Launcher, the C++ launcher), else `kernel[grid](*args,
    **meta)`. `rebind(fn)` puts a site's generated function where the wrapper looks it up."""
    site = getattr(kernel, "site", None)
    if callable(site):
        return site(meta, rebind)
    return lambda grid, *args: kernel[grid](*args, **meta)


class Launcher:
    """A Triton JITFunction; `launcher[grid](*args, **meta)` and `launcher.launch(grid, args, meta)` launch it
    like the JITFunction would."""

    def __init__(self, fn, binaries: Optional[dict] = None, built_for: Optional[list] = None):
        self.fn = fn
        self.fast: dict = {}          # specialization key -> go(grid, stream, args)
        self._names = [p.name for p in fn.params]
        self._constexpr = {p.name for p in fn.params if p.is_constexpr}
        # {config_key(meta): static_launch.binary_facts} of the binaries the compile workers built, for
        # calls with the arguments of `built_for` (a dtype per pointer, the value of every other argument)
        self.binaries, self.built_for = binaries or {}, built_for
        # parameters Triton does not specialize on their value (a layer's seed position): any value of
        # the same width gets the same binary
        self._unspecialized = frozenset(i for i, p in enumerate(fn.params) if getattr(p, "do_not_specialize", False))

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launch(grid, args, meta)

    def launch(self, grid, args, meta):
        """The first call binds the hot path (an instance attribute from then on) and launches through it."""
        tensors = {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        self.launch = _hot_path(self, len(args), tensors)
        return self.launch(grid, args, meta)

    def site(self, meta: dict, rebind: Callable[[Callable], None]) -> Callable:
        """A wrapper line's launch function (`call_site`), generated at its first call for the arguments it
        is called with, then put in the wrapper's place by `rebind`."""
        def first(grid, *args):
            fn = _site_path(self, len(args), {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}, meta)
            rebind(fn)
            return fn(grid, *args)
        return first

    def jit_launch(self, grid, args, meta):
        return self.fn[grid](*args, **meta)

    def first_launch(self, key, grid, args, meta):
        """A specialization not seen yet: launch through the JIT, then keep a launch function for it when
        the call can be replayed exactly: every parameter after the positional ones is a constexpr given
        in meta, and the kernel has the launcher attributes of Triton >= 3.0. The launch function goes
        through torch's C launcher where that can take the kernel, else through the compiled kernel's own
        launcher. A call that cannot be replayed sends this kernel's launches through the JIT for good."""
        go = self.preloaded(key[0], len(grid), args, meta)
        if go is not None:
            go(grid, _device_and_stream()[1](key[0]), _pointers(args))
            if len(self.fast) < _MAX_SPECIALIZATIONS:
                self.fast[key] = go
            return None
        kernel = self.fn[grid](*args, **meta)
        if len(self.fast) >= _MAX_SPECIALIZATIONS or kernel is None:
            return kernel
        go = self.bound(kernel, len(args), len(grid), meta)
        if go is None:
            self.launch = self.jit_launch
            return kernel
        self.fast[key] = go
        return kernel

    def preloaded(self, device: int, grid_rank: int, args, meta: dict) -> Optional[Callable]:
        """go(grid, stream, args) for this call from the binary the compile workers built for it, loaded
        without the JIT; None when there is none or the call is not the one it was built for: each pointer
        of its dtype and 16-byte aligned, every other argument equal to the value it was built with (Triton's
        JIT would then pick that same binary), the parameters after the call's all constexprs in meta."""
        facts = self.binaries.get(config_key(meta)) if self.binaries else None
        if facts is None or not config.static_launch or not _built_for(self.built_for, args, self._unspecialized) \
                or any(n not in self._constexpr or n not in meta for n in self._names[len(args):]):
            return None
        try:
            go = load_binary(facts, device, grid_rank)
            metrics.binaries_loaded += go is not None
            return go
        except Exception as e:      # noqa: BLE001 - a binary gone from Triton's cache: the JIT compiles it
            log.debug("ember: %s: the workers' binary did not load (%s); launching through Triton", self.fn, e)
            return None

    def bound(self, kernel, n_args: int, grid_rank: int, meta: dict) -> Optional[Callable]:
        """go(grid, stream, args) launching the compiled `kernel` again, `args` with integer pointers in place
        of tensors; None when the call cannot be replayed exactly: a parameter after the positional ones that
        is not a constexpr given in meta, or a kernel without the launcher attributes of Triton >= 3.0. Torch's
        C launcher where it takes the kernel, else the compiled kernel's own launcher."""
        rest = self._names[n_args:]
        run = getattr(kernel, "run", None)
        function = getattr(kernel, "function", None)
        packed = getattr(kernel, "packed_metadata", None)
        if kernel is None or any(n not in self._constexpr or n not in meta for n in rest) \
                or None in (run, function, packed):
            return None
        go = static_launch(kernel, n_args, grid_rank) if config.static_launch else None
        if go is None:
            tail, pad = tuple(meta[n] for n in rest), (1,) * (3 - grid_rank)

            def go(grid, stream, args):
                run(*grid, *pad, stream, function, packed, None, None, None, *args, *tail)
        return go


def _pointers(args) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def _built_for(built_for: Optional[list], args, unspecialized=frozenset()) -> bool:
    """Whether a call with `args` gets the binary built for `built_for` (a dtype per pointer, else values;
    at the `unspecialized` positions only the value's type and integer width count)."""
    if built_for is None or len(built_for) != len(args):
        return False
    for i, (spec, a) in enumerate(zip(built_for, args)):
        if isinstance(spec, torch.dtype):
            if not isinstance(a, torch.Tensor) or a.dtype != spec or a.data_ptr() & 15:
                return False
        elif isinstance(a, torch.Tensor) or type(a) is not type(spec):
            return False
        elif i in unspecialized and isinstance(a, int):
            if _width(a) != _width(spec):
                return False
        elif i not in unspecialized and a != spec:
            return False
    return True


def _width(v: int) -> int:
    """The integer type Triton gives an argument it does not specialize: i32, i64 or u64."""
    return 32 if -2**31 <= v < 2**31 else 64 if -2**63 <= v < 2**63 else 65
