"""One chunk of `ember::linear_cross_entropy` (graph/linear_cross_entropy_op.py) in one Triton kernel: each
row's loss from its logits, and the gradient of that loss w.r.t. the logits written over them.

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

import torch

BLOCK = 4096


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rows_loss_and_grad(logits, target, loss, row_stride, vocab, padded, eps,
                           WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits + row * row_stride
        t = tl.load(target + row)
        running_max = tl.full((), float("-inf"), tl.float32)
        running_sum = tl.zeros((), tl.float32)
        logit_sum = tl.zeros((), tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(z, 0))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), 0)
            running_max = new_max
            logit_sum += tl.sum(tl.where(cols < vocab, z, 0.0), 0)
        lse = running_max + tl.log(running_sum)
        z_target = tl.load(base + t).to(tl.float32)
        tl.store(loss + row, lse - (1.0 - eps) * z_target - eps / vocab * logit_sum)
        if WRITE_GRAD:
            for start in range(0, padded, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                z = tl.load(base + cols, mask=cols < vocab, other=0.0).to(tl.float32)
                g = tl.exp(z - lse) - eps / vocab - tl.where(cols == t, 1.0 - eps, 0.0)
                g = tl.where(cols < vocab, g, 0.0)
                tl.store(base + cols, g.to(logits.dtype.element_ty), mask=cols < padded)
    return rows_loss_and_grad


def loss_and_grad(logits: torch.Tensor, target: torch.Tensor, vocab: int, eps: float, write_grad: bool) -> torch.Tensor:
    """Each row's loss (fp32, `[rows, 1]`) of a chunk's logits `[rows, padded]` (rows contiguous; columns past
    `vocab` are padding) against `target` (`[rows]` class indices, none ignored: the op zeroes ignored rows
    afterwards); with `write_grad` the logits are overwritten by the loss's gradient w.r.t. them."""
    rows, padded = logits.shape
    loss = torch.empty((rows, 1), dtype=torch.float32, device=logits.device)
    if rows:
        _kernel()[(rows,)](logits, target, loss, logits.stride(0), vocab, padded, float(eps),
                           WRITE_GRAD=write_grad, BLOCK=BLOCK, num_warps=8)
    return loss


def usable(x: torch.Tensor) -> bool:
    """Whether the op runs the chunks of `x`'s rows through the kernel: on CUDA (its logits, a GEMM's output,
    are contiguous)."""
    return x.device.type == "cuda"
