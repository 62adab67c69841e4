"""One chunk of `ember::linear_cross_entropy` (graph/linear_cross_entropy_op.py) in one Triton kernel: each
row's loss from its logits, and the gradient of that loss w.r.t. the logits, written over them or, where the
logits are the graph's own (returned to the program), into a chunk-sized buffer.

In ATen the chunk took six passes over its `[rows, vocab]` logits and their fp32 log-probabilities
(log_softmax, gather, the label-smoothing sum, exp, the smoothing subtraction, the target's scatter): the
op's per-chunk ATen work cost about 7 ms of a Llama-small training step on an H100 (docs/performance.md,
"Attention masks, channels-last convolutions, LM heads"). Here a program reads its row twice: once for the
row's max, sum of exponentials (online, rescaled as the max grows) and, with label smoothing, sum of
logits; once to write `softmax - (1 - eps) onehot(target) - eps / V` in the logits' dtype, each element
computed in fp32 and rounded once. Columns past the real vocabulary (a padded
GEMM's) take no share of the softmax and get a zero gradient. No fp32 copy of the chunk is made.

    loss = lse - (1 - eps) z[target] - eps / V * sum_j z_j,    lse = log sum_j exp(z_j)   (j < V)

The op calls `loss_and_grad` on CUDA tensors; elsewhere it keeps its ATen form (tests run the kernel through
Triton's interpreter on the CPU).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

BLOCK = 4096
COLUMN_BLOCK = 1024


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rows_loss_and_grad(logits, logits_stride, grad, grad_stride, target, loss, lse_out, vocab, padded, eps,
                           ignore_index, WRITE_GRAD: tl.constexpr, WRITE_LSE: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        src = logits + row * logits_stride
        t = tl.load(target + row)
        counted = t != ignore_index
        # tl.full, not tl.zeros: Triton 3.6's interpreter cannot call tl.zeros (a jit function of its stdlib)
        running_max = tl.full((), float("-inf"), tl.float32)
        running_sum = tl.full((), 0.0, tl.float32)
        logit_sum = tl.full((), 0.0, tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(src + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(z, 0))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), 0)
            running_max = new_max
            logit_sum += tl.sum(tl.where(cols < vocab, z, 0.0), 0)
        lse = running_max + tl.log(running_sum)
        z_target = tl.load(src + t, mask=counted, other=0.0).to(tl.float32)
        tl.store(loss + row, tl.where(counted, lse - (1.0 - eps) * z_target - eps / vocab * logit_sum, 0.0))
        if WRITE_LSE:
            tl.store(lse_out + row, lse)
        if WRITE_GRAD:
            dst = grad + row * grad_stride
            for start in range(0, padded, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                z = tl.load(src + cols, mask=cols < vocab, other=0.0).to(tl.float32)
                g = tl.exp(z - lse) - eps / vocab - tl.where(cols == t, 1.0 - eps, 0.0)
                g = tl.where((cols < vocab) & counted, g, 0.0)
                tl.store(dst + cols, g.to(grad.dtype.element_ty), mask=cols < padded)
    return rows_loss_and_grad


@functools.lru_cache(maxsize=None)
def _columns_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def columns_grad(logits, logits_stride, lse, target, row_scale, grad, grad_stride, first, columns, vocab, eps,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < columns
        col = first + cols
        real = inside & (col < vocab)
        z = tl.load(logits + row * logits_stride + col, mask=real, other=0.0).to(tl.float32)
        t = tl.load(target + row)
        g = tl.exp(z - tl.load(lse + row)) - eps / vocab - tl.where(col == t, 1.0 - eps, 0.0)
        g = tl.where(real, g * tl.load(row_scale + row), 0.0)
        tl.store(grad + row * grad_stride + cols, g.to(grad.dtype.element_ty), mask=inside)
    return columns_grad


def loss_and_grad(logits: torch.Tensor, target: torch.Tensor, vocab: int, eps: float, write_grad: bool,
                  grad: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None, *,
                  ignore_index: int, loss: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each row's loss (fp32, `[rows, 1]`, into `loss` when given) of a chunk's logits (rows of unit column
    stride; columns past `vocab` are padding) against `target` (`[rows]` class indices); a row whose target
    is `ignore_index` gets loss 0 and a zero gradient. With `write_grad` the loss's gradient w.r.t. the
    logits is written into `grad` (`[rows, padded]`, rows contiguous), by default over the logits
    themselves; `lse` (`[rows]`, fp32), when given, receives each row's log-sum-exp."""
    out = logits if grad is None else grad
    rows, padded = out.shape
    if loss is None:
        loss = torch.empty((rows, 1), dtype=torch.float32, device=logits.device)
    if rows:
        _kernel()[(rows,)](logits, logits.stride(0), out, out.stride(0), target, loss,
                           loss if lse is None else lse, vocab, padded, float(eps), ignore_index,
                           WRITE_GRAD=write_grad, WRITE_LSE=lse is not None, BLOCK=BLOCK, num_warps=8)
    return loss


def columns_grad(logits: torch.Tensor, lse: torch.Tensor, target: torch.Tensor, row_scale: torch.Tensor,
                 grad: torch.Tensor, first: int, vocab: int, eps: float) -> None:
    """Columns [first, first + grad.shape[1]) of the loss's gradient w.r.t. `logits` (`[rows, >= vocab]`, unit
    column stride), each row scaled by `row_scale` (fp32, 0 for an ignored row), from the rows' `lse`: written
    into `grad` (`[rows, columns]`, unit column stride); columns past `vocab` get 0."""
    rows, columns = grad.shape
    if rows and columns:
        grid = (rows, -(-columns // COLUMN_BLOCK))
        _columns_kernel()[grid](logits, logits.stride(0), lse, target, row_scale, grad, grad.stride(0), first,
                                columns, vocab, float(eps), BLOCK=COLUMN_BLOCK, num_warps=4)


def usable(x: torch.Tensor) -> bool:
    """Whether the op runs the chunks of `x`'s rows through the kernel: on CUDA (its logits, a GEMM's output,
    are contiguous)."""
    return x.device.type == "cuda"
