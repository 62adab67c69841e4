"""Autotuning: time a kernel's candidate launch configs (block sizes, warps) on its first call for a
size, launch the fastest from then on, and remember the choice on disk.

The candidates come from `codegen/triton/heuristics.py` (the heuristic's own choice first); the wrapper
calls a tuned kernel as `kernel.run(*args)` with no grid, since the grid follows the chosen block size.
Candidates may depend on the launch's sizes (`KernelTuning.configs_for`): a persistent reduction over a
symbolic row needs an RBLOCK that holds the row, so its configs are made per size class; such a kernel
is launched this way even untuned (one candidate per class, nothing timed).
Tuning runs the kernel on the call's real arguments, so every buffer the kernel writes is first copied
and restored afterwards: a kernel that reads what it writes (in place, atomic accumulation) then still
sees the values it would have seen untuned.

The choice is keyed by the kernel's source, the device and the sizes in its arguments rounded up to
powers of two (a dynamic-shape kernel tunes once per size class, not per size), and stored as JSON
under `<ember cache dir>/autotune/`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .launch import Launcher
from .loader import cache_dir

log = logging.getLogger("ember")


@dataclasses.dataclass
class KernelTuning:
    """What the launcher needs beyond the kernel: candidates and where the sizes sit in the arguments."""
    configs: list          # launch metas ({"XBLOCK": .., "RBLOCK": .., "num_warps": ..}), best guess first
    xnumel_arg: int        # position of xnumel in the call's arguments (rnumel follows it)
    tiled: bool            # 2-D grid: (x blocks, r blocks)
    written: list          # positions of the arguments the kernel writes
    # candidates that depend on the launch's sizes: configs_for(xnumel, rnumel) -> metas, best guess first,
    # asked once per size class (a persistent reduction of a symbolic row: RBLOCK must hold the row);
    # `configs` are then those of the example sizes (what is compiled ahead)
    configs_for: Optional[Callable[[int, int], list]] = None
    # of `written`, the arguments the kernel also reads (in-out buffers, atomic adds); None: all of them
    read_back: Optional[list] = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class Autotuned:
    """A Triton kernel with several launch configs; `run(*args)` launches the best one for these sizes (a
    lone candidate is taken as it is)."""

    def __init__(self, fn, tuning: KernelTuning, source: str):
        self.fn, self.tuning = fn, tuning
        self.key = hashlib.sha256(source.encode()).hexdigest()[:24]
        self.best: dict = {}          # size class (powers of two) -> config
        self.ready: dict = {}         # exact size arguments -> (config, grid)
        # ember's Launcher takes (grid, args, meta) without the frame and closure of `fn[grid](...)`
        self._launcher = isinstance(fn, Launcher)

    def grid(self, cfg: dict, args) -> tuple:
        x = args[self.tuning.xnumel_arg]
        g = (_cdiv(x, cfg["XBLOCK"]),)
        if self.tuning.tiled:
            g += (_cdiv(args[self.tuning.xnumel_arg + 1], cfg["RBLOCK"]),)
        return g

    def launch(self, cfg: dict, args) -> None:
        grid = self.grid(cfg, args)
        if self._launcher:
            self.fn.launch(grid, args, cfg)
        else:
            self.fn[grid](*args, **cfg)

    def run(self, *args) -> None:
        # the launch path runs on every call: one dict lookup by the exact sizes (xnumel, rnumel and size
        # symbols sit at the end of the arguments) finds the config and its grid
        ints = args[self.tuning.xnumel_arg:]
        hit = self.ready.get(ints)
        if hit is None:
            sizes = tuple(_pow2(a) for a in ints if isinstance(a, int) and not isinstance(a, bool))
            cfg = self.best.get(sizes)
            if cfg is None:
                cfg = self.best[sizes] = self._choose(sizes, args)
            hit = self.ready[ints] = (cfg, self.grid(cfg, args))
        cfg, grid = hit
        if self._launcher:
            self.fn.launch(grid, args, cfg)
        else:
            self.fn[grid](*args, **cfg)

    # -- choosing ----------------------------------------------------------------------------------------

    def _path(self, sizes) -> str:
        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        h = hashlib.sha256(f"{self.key}|{dev}|{sizes}".encode()).hexdigest()[:24]
        return os.path.join(cache_dir(), "autotune", f"{h}.json")

    def candidates(self, args) -> list:
        t = self.tuning
        if t.configs_for is None:
            return t.configs
        return t.configs_for(args[t.xnumel_arg], args[t.xnumel_arg + 1])

    def _choose(self, sizes, args) -> dict:
        configs = self.candidates(args)
        if len(configs) == 1:
            return configs[0]
        return self._load(sizes, configs) or self._tune(sizes, args, configs)

    def _load(self, sizes, configs):
        cfg = read_choice(self._path(sizes))
        return cfg if cfg in configs else None

    def _tune(self, sizes, args, configs) -> dict:
        best = fastest(configs, lambda cfg: self._time(cfg, args), args, self.tuning.written, "ember autotune",
                       self.tuning.read_back)
        self._save(sizes, best)
        return best

    def _time(self, cfg, args) -> float:
        """Median time of one launch in ms (a first launch compiles and warms up)."""
        # logged before the launch: a candidate that faults (a CUDA error is sticky) is the last one named
        log.debug("ember autotune: timing %s (kernel %s)", cfg, self.key)
        self.launch(cfg, args)
        once = self._time_once(cfg, args)
        reps = max(3, min(25, int(2.0 / max(once, 1e-3))))    # about 2 ms of launches, 3 to 25 of them
        times = sorted(self._time_once(cfg, args) for _ in range(reps))
        return times[len(times) // 2]

    def _time_once(self, cfg, args) -> float:
        return time_once(lambda: self.launch(cfg, args))

    def _save(self, sizes, cfg) -> None:
        write_choice(self._path(sizes), cfg)


def fastest(candidates: list, time: Callable, args, written, what: str, read_back=None):
    """The candidate `time(candidate)` says is fastest. Of the arguments a launch writes (positions
    `written` in `args`), those a repeated launch changes are restored afterwards (`changed_by_relaunch`);
    a candidate that fails (a config the compiler rejects, a launch that fails) is dropped with a debug log
    line. The caller launches the chosen candidate next, which writes the other outputs as one launch would."""
    saved = {i: args[i].clone() for i in changed_by_relaunch(args, written, read_back)}
    timings = []
    # A first run can happen under a dispatch mode (AOTAutograd analyzes custom ops' aliasing in one), which
    # sends every ATen call through Python: a library candidate would be timed with that host cost
    with _disable_current_modes():
        for cand in candidates:
            try:
                timings.append((time(cand), cand))
            except Exception as e:          # noqa: BLE001 - any failure only drops the candidate
                log.debug("%s: %s dropped: %s", what, cand, e)
    for i, t in saved.items():
        args[i].copy_(t)
    if not timings:
        raise RuntimeError(f"{what}: no candidate runs: {candidates}")
    best = min(timings, key=lambda tc: tc[0])[1]
    log.debug("%s: %s", what, [(round(t * 1e3, 1), c) for t, c in timings])
    return best


def changed_by_relaunch(args, written, read_back=None) -> list:
    """Positions of written arguments that a second launch would leave different from the first: those the
    kernel reads before writing (`read_back`; None: every written one) and those sharing memory with
    another argument (an output computed in place of an input it reads). Only these need a copy while
    candidates are timed: GPT-2's loss graph tuned a kernel with a 0.77 GB output, whose copy was the
    first call's peak."""
    back = set(written if read_back is None else read_back)
    storages = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            storages.setdefault(a.untyped_storage().data_ptr(), []).append(i)
    shared = {i for group in storages.values() if len(group) > 1 for i in group}
    return [i for i in written if i in back or i in shared]


BACK_TO_BACK = 10       # launches per timed sample, as in a model
# GPU cycles the stream sleeps before a GPU-only sample (about 1 ms): the host queues the sample's launches
# meanwhile, so a launch of a few microseconds is timed on the GPU, not by the host's pace of launching
SLEEP_CYCLES = 2_000_000


def median_ms(launch: Callable[[], None], samples: int = 5, gpu_only: bool = False) -> float:
    """Median over `samples` of one launch's milliseconds, each sample BACK_TO_BACK launches (the first
    launch compiles and warms up). `gpu_only`: the GPU's time alone (see SLEEP_CYCLES)."""
    launch()

    def launches():
        for _ in range(BACK_TO_BACK):
            launch()
    times = []
    for _ in range(samples):
        if gpu_only and torch.cuda.is_available():
            torch.cuda._sleep(SLEEP_CYCLES)
        times.append(time_once(launches) / BACK_TO_BACK)
    return sorted(times)[len(times) // 2]


def time_once(launch: Callable[[], None]) -> float:
    """Milliseconds one call of `launch` runs on the GPU (on the CPU, the interpreter: wall time)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        launch()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def read_choice(path: str):
    """A tuning choice stored by write_choice (None if there is none, or it cannot be read)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_choice(path: str, choice) -> None:
    """Store a tuning choice (JSON) atomically."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(choice, f)
    os.replace(tmp, path)
