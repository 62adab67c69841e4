"""Launching a GEMM template kernel (codegen/triton/gemm_template.py), and choosing, at its first call, among
its launch configs (BLOCK_M/N/K, GROUP_M, warps, stages).

A template chosen over the library call by timing before lowering (gemm_templates="auto") comes with the
one config that timing found fastest and is launched as it is. Otherwise ("always") each candidate runs
on the call's real arguments (the buffers the kernel writes are copied first and restored after), timed
as the median of a few samples of back-to-back launches; one that fails to compile or run is dropped (a
debug log line says why). The choice is kept on disk under `<ember cache dir>/autotune/`, keyed by the
kernel's source (which holds every size, stride and dtype), the device, and Triton's version. A lone
candidate is launched without timing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from typing import Optional

import torch

from .autotune import fastest, median_ms, read_choice, write_choice
from .launch import Launcher
from .loader import cache_dir

log = logging.getLogger("ember")


@dataclasses.dataclass
class TemplateTuning:
    """What the launcher needs beyond the kernel: candidates, the product's sizes (for the grid) and where
    the written arguments are."""
    configs: list           # launch metas, best guess first
    sizes: tuple            # (batch, M, N, K)
    written: list           # positions of the arguments the kernel writes
    persistent: bool = True  # programs walk the tiles (at most one per SM); False: one program per tile
    read_back: Optional[list] = None    # of those, the ones the kernel also reads (None: all of them)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# programs of a template's grid under Triton's interpreter: a few, so that each walks several tiles as on a GPU
INTERPRETED_PROGRAMS = 3


def max_programs(device: torch.device) -> int:
    """The most programs a template's persistent grid launches on `device`: one per SM on a GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETED_PROGRAMS


def template_grid(sizes: tuple, cfg: dict, programs: int, persistent: bool = True) -> tuple:
    """The grid of a template kernel (gemm_template.py) over a product of (batch, M, N, K): one program per
    output tile of every batch entry, and if `persistent`, at most `programs`, each walking tiles that far
    apart."""
    batch, m, n, _ = sizes
    tiles = batch * _cdiv(m, cfg["BLOCK_M"]) * _cdiv(n, cfg["BLOCK_N"])
    return (max(1, min(programs, tiles) if persistent else tiles),)


class TemplateChoice:
    """A template kernel with its candidates; `run(*args)` launches the chosen one."""

    def __init__(self, fn, tuning: TemplateTuning, source: str):
        self.fn, self.tuning = fn, tuning
        self.key = hashlib.sha256(source.encode()).hexdigest()[:24]
        self.chosen = None          # a config
        self.programs = None        # the grid's most programs, from the device of the first call's arguments
        # ember's Launcher takes (grid, args, meta) without the frame and closure of `fn[grid](...)`
        self._launcher = isinstance(fn, Launcher)

    def grid(self, cfg: dict) -> tuple:
        return template_grid(self.tuning.sizes, cfg, self.programs, self.tuning.persistent)

    def launch(self, cfg, args) -> None:
        self._bound(cfg)(*args)

    def _set_programs(self, args) -> None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        self.programs = max_programs(device)

    def run(self, *args) -> None:
        """The first call chooses (or reads the choice from disk), then binds `run` to the chosen candidate's
        launch with its grid and views worked out once: a product of a few tens of microseconds is launched
        back to back in a model, where per-call Python shows."""
        if self.programs is None:
            self._set_programs(args)
        if self.chosen is None:
            self.chosen = self._choose(args)
        # launched before binding: a Launcher's first launch installs the hot path that the binding keeps
        self.launch(self.chosen, args)
        self.run = self._bound(self.chosen)

    def _bound(self, cfg):
        grid = self.grid(cfg)
        if self._launcher:
            launch = self.fn.launch
            return lambda *args: launch(grid, args, cfg)
        kernel = self.fn[grid]
        return lambda *args: kernel(*args, **cfg)

    # -- choosing ----------------------------------------------------------------------------------------

    def candidates(self) -> list:
        return list(self.tuning.configs)

    def _choose(self, args):
        cands = self.candidates()
        if len(cands) == 1:
            return cands[0]
        return self._load(cands) or self._tune(args, cands)

    def _path(self) -> str:
        import triton
        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        h = hashlib.sha256(f"template|{self.key}|{dev}|{triton.__version__}".encode()).hexdigest()[:24]
        return os.path.join(cache_dir(), "autotune", f"{h}.json")

    def _load(self, cands):
        choice = read_choice(self._path())
        return choice if choice in cands else None

    def _tune(self, args, cands):
        best = fastest(cands, lambda cand: self._time(cand, args), args, self.tuning.written,
                       "ember template autotune", self.tuning.read_back)
        write_choice(self._path(), best)
        return best

    def _time(self, cand, args) -> float:
        """Median time of one launch in ms (a first launch compiles and warms up)."""
        log.debug("ember template autotune: timing %s (kernel %s)", cand, self.key)
        return median_ms(lambda: self.launch(cand, args))
