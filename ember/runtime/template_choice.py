"""Launching a GEMM template kernel (codegen/triton/gemm_template.py), and choosing, at its first call, between
its launch configs and the library's way to the same outputs.

The candidates are the template's configs (BLOCK_M/N/K, GROUP_M, warps, stages) and, where the kernel was
generated with one (ember.config.gemm_templates="auto" on a backend that times), the ExternProduct: ATen's
mm/bmm (cuBLAS) into memory, then the fused group's other nodes as a plain pointwise kernel reading it.
Each candidate runs on the call's real arguments (the buffers the kernel writes are copied first and
restored after), timed as the median of a few samples of back-to-back launches; one that fails to compile or run is dropped (a
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

from .autotune import fastest, read_choice, time_once, write_choice
from .launch import Launcher
from .loader import cache_dir

log = logging.getLogger("ember")


@dataclasses.dataclass
class ExternProduct:
    """The library alternative of a template kernel, in terms of the kernel's call arguments."""
    op: str                 # "mm" or "bmm"
    operands: list          # per operand: (argument position of its base tensor, size, stride, offset in it)
    size: list              # the product's size and stride, dtype
    stride: list
    dtype: torch.dtype
    product_arg: Optional[int]   # where the kernel stores the product itself: its argument position
    epilogue: Optional[str]      # the name of the pointwise kernel computing the rest (in the same module)
    epilogue_args: list          # its pointer arguments: call argument positions, -1 for the product
    epilogue_meta: dict          # its launch meta (XBLOCK, num_warps)
    xnumel: int


@dataclasses.dataclass
class TemplateTuning:
    """What the launcher needs beyond the kernel: candidates, the product's sizes (for the grid) and where
    the written arguments are."""
    configs: list           # launch metas, best guess first
    sizes: tuple            # (batch, M, N, K)
    written: list           # positions of the arguments the kernel writes
    extern: Optional[ExternProduct] = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_EXTERN = "extern"
BACK_TO_BACK = 10       # launches per timed sample


class TemplateChoice:
    """A template kernel with its candidates; `run(*args)` launches the chosen one."""

    def __init__(self, fn, epilogue, tuning: TemplateTuning, source: str):
        self.fn, self.epilogue, self.tuning = fn, epilogue, tuning
        self.key = hashlib.sha256(source.encode()).hexdigest()[:24]
        self.chosen = None          # a config, or _EXTERN
        self._extern = None         # the library candidate's launch function, once built
        # ember's Launcher takes (grid, args, meta) without the frame and closure of `fn[grid](...)`
        self._launcher = isinstance(fn, Launcher)

    def grid(self, cfg: dict) -> tuple:
        batch, m, n, _ = self.tuning.sizes
        return (_cdiv(m, cfg["BLOCK_M"]) * _cdiv(n, cfg["BLOCK_N"]), batch)

    def launch(self, cfg, args) -> None:
        self._bound(cfg)(*args)

    def run(self, *args) -> None:
        """The first call chooses (or reads the choice from disk), then binds `run` to the chosen candidate's
        launch with its grid and views worked out once: a product of a few tens of microseconds is launched
        back to back in a model, where per-call Python shows."""
        if self.chosen is None:
            self.chosen = self._choose(args)
        self.run = self._bound(self.chosen)
        self.run(*args)

    def _bound(self, cfg):
        if cfg == _EXTERN:
            return self._bound_extern()
        grid = self.grid(cfg)
        if self._launcher:
            launch = self.fn.launch
            return lambda *args: launch(grid, args, cfg)
        kernel = self.fn[grid]
        return lambda *args: kernel(*args, **cfg)

    def _bound_extern(self):
        """The library candidate as one function of the call's arguments: ATen's product of the operands'
        views (into the product's argument, or a new buffer), then the epilogue kernel reading it."""
        if self._extern is not None:
            return self._extern
        e = self.tuning.extern
        (pa, size_a, stride_a, off_a), (pb, size_b, stride_b, off_b) = e.operands
        product = torch.bmm if e.op == "bmm" else torch.mm
        as_strided, empty_strided = torch.as_strided, torch.empty_strided
        epilogue = None
        if e.epilogue is not None:
            epilogue = self.epilogue[(_cdiv(e.xnumel, e.epilogue_meta["XBLOCK"]),)]
        positions, xnumel, meta = e.epilogue_args, e.xnumel, e.epilogue_meta

        def run(*args):
            a, b = args[pa], args[pb]
            out = args[e.product_arg] if e.product_arg is not None else \
                empty_strided(e.size, e.stride, dtype=e.dtype, device=a.device)
            product(as_strided(a, size_a, stride_a, a.storage_offset() + off_a),
                    as_strided(b, size_b, stride_b, b.storage_offset() + off_b), out=out)
            if epilogue is not None:
                epilogue(*[out if i < 0 else args[i] for i in positions], xnumel, **meta)
        self._extern = run
        return run

    # -- choosing ----------------------------------------------------------------------------------------

    def candidates(self) -> list:
        return list(self.tuning.configs) + ([_EXTERN] if self.tuning.extern is not None else [])

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
                       "ember template autotune")
        write_choice(self._path(), best)
        return best

    def _time(self, cand, args) -> float:
        """Median time of one launch in ms (a first launch compiles and warms up)."""
        log.debug("ember template autotune: timing %s (kernel %s)", cand, self.key)
        self.launch(cand, args)
        times = sorted(self._time_once(cand, args) for _ in range(5))
        return times[len(times) // 2]

    def _time_once(self, cand, args) -> float:
        # back-to-back launches, as in a model: the library path is two launches with host work between
        # them, which one launch timed from an idle GPU would count as GPU time
        def launches():
            for _ in range(BACK_TO_BACK):
                self.launch(cand, args)
        return time_once(launches) / BACK_TO_BACK
