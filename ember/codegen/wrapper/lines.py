"""Wrapper IR: what the host-side program does, as a list of structured lines (never raw strings).
Both renderers (Python source, FX GraphModule) consume these."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ...runtime.autotune import KernelTuning
from ...runtime.compile_pool import WarmSpec
from ...runtime.compile_profile import stage


class Name(str):
    """A reference to a value bound in the wrapper (an input, a buffer, a symbol)."""


@dataclasses.dataclass
class SymbolDef:
    """Bind a size symbol from a graph input: `s0 = arg0.size(1)` (what='size'), or the input itself."""
    name: str
    source: str
    what: str            # "size" | "stride" | "offset" | "value"
    dim: Optional[int] = None


@dataclasses.dataclass
class Allocate:
    name: str
    size: list
    stride: list
    dtype: torch.dtype
    device: torch.device


@dataclasses.dataclass
class Free:
    names: list


@dataclasses.dataclass
class Reuse:
    """Give a dead buffer's memory to a new one of the same size and layout. With release_old False the
    old name stays bound (an in-place kernel reads it while writing the new one; a Free drops it later)."""
    name: str
    old: str
    release_old: bool = True


@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """A kernel's parameters in the order the wrapper passes them: buffer pointers, then int64 sizes."""
    pointers: tuple
    sizes: tuple


@dataclasses.dataclass
class DefineKernel:
    name: str
    source: str
    backend: Any         # the ember.device.KernelBackend that generated it, and loads it
    # candidate launch configs, timed at first call (autotuning), or made per size class (a persistent
    # reduction over a symbolic row: RBLOCK follows the row's length)
    tuning: Optional[KernelTuning] = None
    warm: Optional[WarmSpec] = None         # how it will be launched, to compile it ahead (GPU only)
    device: Optional[torch.device] = None   # where it runs (Triton on a GPU launches on the current device)
    signature: Optional[KernelSignature] = None


@dataclasses.dataclass(frozen=True)
class FiniteCheck:
    """config.check_nans: the values a device call writes, checked for NaN and Inf right after it."""
    what: str            # the call and the FX nodes it computes: "kernel3 (fx nodes: add_1, exp)"
    names: tuple         # the wrapper names bound to the values
    origins: tuple       # per value: its FX node and the user's source line, as the error quotes them
    reads: tuple = ()    # the wrapper names of the tensors the call reads: the error says which held NaN or Inf


@dataclasses.dataclass(frozen=True)
class ProfiledCall:
    """config.report: the profiler range the wrapper opens around a device call (torch.profiler attributes
    the call's time to it: a C++ kernel is invisible to the profiler otherwise, and a GPU kernel's time goes
    to the range it was launched in), and the bytes the call moves (codegen/traffic.py)."""
    range: str           # unique in the process: "ember g2 #7 kernel3"
    group: int           # the index of the fused group the call runs, in the order the program runs them
    bytes_read: int
    bytes_written: int


@dataclasses.dataclass
class CallKernel:
    name: str
    args: list           # Names and sympy expressions
    grid: Optional[list]  # sympy expressions; None for a kernel with `tuning`, whose grid follows its config
    meta: dict           # launch-time constants: XBLOCK, RBLOCK, num_warps (empty with `tuning`)
    check: Optional[FiniteCheck] = None     # set by the program builder with config.check_nans
    profile: Optional[ProfiledCall] = None  # set by the program builder with config.report


@dataclasses.dataclass(frozen=True)
class Collective:
    """Marks a CallExtern as communication (ir/collectives.py). An "issue" call starts a collective on
    process group `group`: its results are written, and its tensor arguments read, until the "wait" call
    that completes them. A wait (`name = wait_tensor(name)`) returns the tensor it waits on; `issued_by`
    names the issuing call's result (None for a collective issued outside the graph)."""
    kind: str                        # "issue" | "wait"
    group: Any = None                # "issue": the process group's name, as the op takes it
    issued_by: Optional[str] = None  # "wait"


@dataclasses.dataclass
class CallExtern:
    name: Optional[str]  # the result's name (None when the op returns nothing used)
    op: Any              # a torch OpOverload
    args: list
    kwargs: dict
    check: Optional[FiniteCheck] = None     # set by the program builder with config.check_nans
    profile: Optional[ProfiledCall] = None  # set by the program builder with config.report
    collective: Optional[Collective] = None  # set for a collective's issue or wait


def device_call_label(ln) -> Optional[str]:
    """How config.debug_sync names a line that runs work on the device (None for any other line)."""
    if isinstance(ln, CallKernel):
        return ln.name
    if isinstance(ln, CallExtern):
        op = str(getattr(ln.op, "__name__", ln.op))
        return f"{ln.name} = {op}" if ln.name else op
    return None


@dataclasses.dataclass
class MultiOutputLine:
    name: str
    parent: str
    path: tuple


@dataclasses.dataclass
class View:
    """`name`: base's storage seen with `size` and `stride`, starting `offset` elements past the base's
    own storage offset at run time (a graph input may arrive with another offset than its example had)."""
    name: str
    base: str
    size: list
    stride: list
    offset: Any


@dataclasses.dataclass
class Assert:
    """Check a tensor's size, stride and (unless None) dtype at run time (extern outputs, when config
    asks). With `conform`, a tensor with other strides or dtype is replaced by a copy in the expected
    layout instead of raising."""
    name: str
    size: list
    stride: list
    conform: bool = False
    dtype: Optional[torch.dtype] = None


@dataclasses.dataclass
class Return:
    values: list


LINE_TYPES = (SymbolDef, Allocate, Free, Reuse, DefineKernel, CallKernel, CallExtern, MultiOutputLine, View,
              Assert, Return)


@dataclasses.dataclass
class WrapperProgram:
    inputs: list                      # input names in call order
    lines: list
    constants: dict                   # name -> tensor (get_attr constants)
    # a forward graph's outputs' strides where its layouts were planned (graph/passes/conv_layout.py),
    # reported to AOTAutograd for the backward; empty otherwise
    output_strides: tuple = ()

    def kernels(self) -> list:
        return [ln for ln in self.lines if isinstance(ln, DefineKernel)]

    def load_kernels(self) -> dict:
        """Kernel name -> launchable, for every DefineKernel line, each loaded by its backend."""
        by_backend: dict = {}
        for k in self.kernels():
            by_backend.setdefault(k.backend, []).append(k)
        out: dict = {}
        with stage("kernel compile/load"):
            for backend, kernels in by_backend.items():
                out.update(backend.load(kernels))
        return out
