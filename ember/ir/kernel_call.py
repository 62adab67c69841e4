"""KernelCall: a node the wrapper runs as kernels ember wrote for it alone (FlexAttention's forward and
backward: codegen/triton/flex_attention*.py), rather than as an ATen call or a fused group.

It is an ExternKernel to the scheduler and the memory planner (never fused, reads its `args`, results
are its MultiOutputs), so nothing there changes. The program builder (codegen/program.py) allocates each
result, then defines and launches each of `launches` with the inputs then the results as pointer
arguments: a DefineKernel and a CallKernel per launch, the lines any generated kernel has.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .nodes import ExternKernel, MultiOutput


@dataclasses.dataclass
class Launch:
    source: Callable[[str], str]     # kernel name -> the kernel's source
    grid: list                       # ints
    meta: dict                       # constexprs and num_warps / num_stages


class KernelCall(ExternKernel):
    def __init__(self, kind: str, device, inputs: list, launches: list):
        super().__init__(None, None, kind, list(inputs), {})
        self._device = device
        self.launches = launches
        self.results: list[MultiOutput] = []

    @property
    def device(self):
        return self._device


def is_kernel_call_result(buf) -> bool:
    return isinstance(buf, MultiOutput) and isinstance(buf.parent, KernelCall)
