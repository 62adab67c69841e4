"""Template buffers: values a kernel backend computes with a hand-written main loop (a template) rather than
from a generated loop body, into whose output tile the scheduler fuses pointwise consumers.

A MatmulTemplate is the product of two stored operands, `a @ b` (mm) or a batch of them (bmm), accumulated
in float32 and stored in the operands' dtype (or in float32: the partial products of a product decomposed
along K, `split_k_views`). It is a ComputedBuffer like any other, so dependencies, fusion,
memory planning and structural keys treat it as one node: its `data.inner_fn(index)` states which operand
elements output element `index` reads (row `m` of `a` and column `n` of `b` along a reduction symbol
`K_SYMBOL`), and the product of the two. Only a backend whose `gemm_templates` is true renders it; the
template itself lives with the backend (codegen/triton/gemm_template.py).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import sympy
import torch

from .nodes import Buffer, ComputedBuffer, Layout, Loops, ReinterpretView
from .ops import ops

# the position along K in the operands' index expressions: a symbol no kernel index contains, so that no
# other node's access ever looks like the same element as the template's operand reads
K_SYMBOL = sympy.Symbol("kmm", integer=True, nonnegative=True)


@dataclasses.dataclass(eq=False)
class MatmulProduct(Loops):
    """out[b, m, n] = sum over k of a[b, m, k] * b[b, k, n] (no b index without a batch). `a` and `b` are
    stored (Buffer or ReinterpretView) with static sizes; `dtype` is the product's as stored (the operands'
    or float32)."""
    a: Buffer | ReinterpretView = None
    b: Buffer | ReinterpretView = None
    batched: bool = False
    # the launch config timed fastest for this product when it was chosen over the library call
    # (ember.config.gemm_templates="auto"); None: the kernel's candidates are timed at its first call
    launch: Optional[dict] = None
    # the dtype the product multiplies: the operands', or what an operand stored in another dtype is cast to
    # on its tile (a prologue: autocast's cast of a float32 weight)
    operand_dtype: Optional[torch.dtype] = None
    # float32 operands multiply in TF32, as the eager op would (torch.backends.cuda.matmul.allow_tf32 for a
    # matrix product, torch.backends.cudnn.allow_tf32 for a convolution)
    tf32: bool = False

    def sizes(self) -> tuple:
        """(batch, M, N, K) as ints (batch 1 for mm)."""
        asz, bsz = self.a.get_size(), self.b.get_size()
        batch = int(asz[0]) if self.batched else 1
        return batch, int(asz[-2]), int(bsz[-1]), int(asz[-1])


def _product_body(a, b, batched):
    load_a, load_b = a.make_loader(), b.make_loader()

    def inner_fn(index):
        *batch, m, n = index
        return ops.mul(load_a([*batch, m, K_SYMBOL]), load_b([*batch, K_SYMBOL, n]))
    return inner_fn


class TemplateBuffer(ComputedBuffer):
    """A ComputedBuffer whose value a backend's template computes (its `data` is a MatmulProduct)."""

    @staticmethod
    def matmul(a, b, batched: bool, launch: Optional[dict] = None, dtype: Optional[torch.dtype] = None,
               operand_dtype: Optional[torch.dtype] = None, tf32: bool = False) -> "TemplateBuffer":
        """a @ b stored in `dtype` (default: the operand dtype), multiplied in `operand_dtype` (default: a's;
        an operand stored in another dtype is cast to it as its tile is loaded), float32 in TF32 where `tf32`."""
        operand_dtype = operand_dtype or a.get_dtype()
        device, dtype = a.get_device(), dtype or operand_dtype
        size = [*(a.get_size()[:1] if batched else []), a.get_size()[-2], b.get_size()[-1]]
        data = MatmulProduct(device, dtype, _product_body(a, b, batched), list(size), a, b, batched, launch,
                             operand_dtype, tf32)
        return TemplateBuffer(None, Layout.contiguous(device, dtype, size), data)

    def operands(self) -> list:
        return [self.data.a, self.data.b]


def stored_base(x) -> tuple:
    """(the buffer, the layout) of a stored value: a Buffer, or a ReinterpretView of one."""
    return (x.data, x.layout) if isinstance(x, ReinterpretView) else (x, x.layout)


def operand_base(x) -> tuple[Buffer, int]:
    """(the buffer whose memory a stored operand reads, the operand's offset in elements from that buffer's
    own start): kernels get the buffer's tensor, whose data pointer already includes its storage offset."""
    if isinstance(x, ReinterpretView):
        return x.data, int(x.layout.offset - x.data.layout.offset)
    return x, 0


def split_k_views(a, b, splits: int) -> tuple:
    """a [M, K] and b [K, N] (stored) viewed as a batch of `splits` products along K: a as [splits, M, K/splits]
    and b as [splits, K/splits, N], over the same memory (split s reads K's s-th slice of both)."""
    return _split_view(a, splits, 1), _split_view(b, splits, 0)


def _split_view(x, splits: int, kdim: int) -> ReinterpretView:
    base, layout = stored_base(x)
    size, stride = list(layout.size), list(layout.stride)
    depth = size[kdim] // splits
    size[kdim] = depth
    return ReinterpretView(base, Layout(layout.device, layout.dtype, [sympy.Integer(splits), *size],
                                        [depth * stride[kdim], *stride], layout.offset))


# the key of a launch config (a product's choice) that decomposes it along K: the number of K's slices (the
# config's other keys are the batched template's)
SPLITS = "decompose_k"
# K's splits worth trying: each split at least this deep, and a multiple of 16 (the template's smallest BLOCK_K)
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_COUNTS = (2, 4, 8, 16, 32, 64)
# a product is decomposed along K only where K is this many times its output's larger side
SPLIT_K_MIN_RATIO = 8


def split_k_counts(m: int, n: int, k: int, min_depth: int = SPLIT_K_MIN_DEPTH) -> list:
    """The numbers of splits along K a product of (M, N, K) may be decomposed into: none unless K is long
    beside the output (SPLIT_K_MIN_RATIO); each split divides K into slices at least `min_depth` deep and
    a multiple of 16."""
    if k < SPLIT_K_MIN_RATIO * max(m, n):
        return []
    return [s for s in SPLIT_K_COUNTS if k % s == 0 and (k // s) % 16 == 0 and k // s >= min_depth]


def is_template(buf) -> bool:
    return isinstance(buf, TemplateBuffer)


@dataclasses.dataclass(frozen=True)
class ProductSpec:
    """A matrix product as the graph states it, for choosing between a template and the library call before
    it is lowered (ember.config.gemm_templates="auto"; lowering/matmul.py asks the backend's
    `choose_products`). Sizes and strides are the operands' in the traced graph; `bias` (addmm) likewise.
    `epilogue_share` is how much of the product's round trip through memory a fused epilogue saves: 1 when
    every reader of the product is pointwise (it is never stored), 0.5 when it is stored anyway for another
    reader (only the re-read is saved), 0 when nothing pointwise reads it. `epilogue` sketches what those
    pointwise readers would do on the template's tile: "load_full" for each other input of the product's
    size they read, "load_row" for each smaller one (a bias), and the names of their one-operand ops
    ("tanh", "erf", ...), in graph order. A 1x1 convolution of a channels-last input is the product of its
    input's rows and its weight's transpose ("conv1x1"; lowering/matmul.py, pointwise_convolution)."""
    op: str                          # "mm", "bmm", "addmm" or "conv1x1"
    a: tuple                         # (size, stride) of each operand
    b: tuple
    bias: Optional[tuple]
    dtype: torch.dtype
    epilogue_share: float
    epilogue: tuple = ()
    # "conv1x1": (size, stride) of the convolution's input and weight (a and b are the product they make:
    # the input's [N*H*W, C_in] rows and the weight's transpose)
    conv: Optional[tuple] = None
    # float32 operands multiply in TF32 (MatmulProduct.tf32)
    tf32: bool = False

    def sizes(self) -> tuple:
        """(batch, M, N, K)."""
        (asz, _), (bsz, _) = self.a, self.b
        return (asz[0] if self.op == "bmm" else 1), asz[-2], bsz[-1], asz[-1]
