"""KernelCall: a node the wrapper runs as kernels ember wrote for it alone (FlexAttention's forward and
backward, attention with few queries), rather than as an ATen call or a fused group; and the plain
descriptions of such calls from which a backend writes those kernels (FlexAttentionSpec,
ShortQueryAttentionSpec).

It is an ExternKernel to the scheduler and the memory planner (never fused, reads its `args`, results
are its MultiOutputs), so nothing there changes. The program builder (codegen/program.py) allocates each
result, then defines and launches each of `launches` with the inputs then the results as pointer
arguments: a DefineKernel and a CallKernel per launch, the lines any generated kernel has.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.fx

from .nodes import ExternKernel, Layout, MultiOutput


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


@dataclasses.dataclass
class FlexAttentionSpec:
    """One call of FlexAttention's forward or backward HOP, validated and with its tensor arguments stored
    (lowering/flex_attention.py), for a backend's `flex_attention_launches(spec)` (the Triton backend's:
    codegen/triton/flex_launch.py). That returns the input buffers its kernels read after the spec's (the
    captured tensors' bases) and the Launches; the KernelCall's inputs are `operands`, then `block_mask`,
    then those, and its results are `results`, all in their dicts' order."""
    backward: bool
    sizes: tuple                     # (B, Hq, M, D, Bkv, Hkv, N, Dv): ints
    dtype: torch.dtype               # of q, k and v
    operands: dict                   # "q", "k", "v" (backward: "out", "do", "lse"[, "dlse"]) -> stored buffer
    block_mask: dict                 # the BlockMask's tensors present ("kv_num", "kv_idx", ...) -> stored buffer
    sparse_q: int                    # the BlockMask's sparse block sizes as given (2**30: the whole sequence)
    sparse_kv: int
    score_mod: torch.fx.GraphModule  # the backward's forward graph
    mask_mod: torch.fx.GraphModule
    joint: Optional[torch.fx.GraphModule]     # the backward's joint graph; None in the forward
    score_captured: list             # the TensorBoxes score_mod reads after its index arguments, stored
    mask_captured: list              # the TensorBoxes mask_mod reads after its index arguments, stored
    scale: float
    kernel_options: dict
    results: dict                    # "out", "lse"[, "max"] (backward: "dq", "dk", "dv", "delta") -> Layout

    def result_layouts(self) -> list[Layout]:
        return list(self.results.values())


@dataclasses.dataclass
class ShortQueryAttentionSpec:
    """One fused scaled-dot-product attention forward whose key/value heads each serve few query rows (query
    heads per key/value head times queries: a decoding step), checked and with its tensors stored
    (lowering/short_attention.py), for a backend's `short_query_attention_launches(spec)` (the Triton
    backend's: codegen/triton/short_attention.py). That returns the (dtype, size) of the scratch results its
    kernels need and the Launches; the KernelCall's inputs are `operands` in order, its results the output
    (`out`), then the scratch."""
    sizes: tuple                     # (B, Hq, M, D, Hkv, N, Dv): ints
    dtype: torch.dtype               # of q, k, v and the output
    operands: dict                   # "q", "k", "v"[, "bias"] -> stored buffer
    strides: dict                    # "q", "k", "v", "bias", "out" -> 4 strides, 0 along broadcast dims
    mask: str                        # "none"; "additive": `bias` is added to the scores; "boolean": keys
                                     # kept where it is true
    is_causal: bool                  # key n seen by query i when n <= i
    scale: float
    out: Layout
