"""`ember::linear_cross_entropy`: cross-entropy of a linear layer's output, computed in chunks of rows so that
the `[rows, vocab]` logits, their fp32 copy, their softmax and their gradient exist only one chunk at a time
(the approach of Liger-Kernel's fused linear cross-entropy). `graph/passes/linear_cross_entropy.py` rewrites
`F.cross_entropy(F.linear(x, W, b) [.float()] [.view(-1, V)], target, ...)` into it.

    linear_cross_entropy(x[N, H], weight[V, H], bias[V]?, target[N], ignore_index, reduction, label_smoothing,
                         chunk_rows, out_dtype, grad_x, grad_weight, grad_bias)
        -> (loss, dx[N, H], dweight[V, H], dbias[V])

The forward computes, for each chunk of rows, the logits (one GEMM in the inputs' dtype), their row max and
log-sum-exp in fp32, the chunk's loss, and the gradient of the loss w.r.t. the chunk's logits
(softmax - smoothed one-hot, scaled by the reduction, zero on ignored rows); it then spends that gradient at
once: dx[chunk] = dlogits @ W, dW += dlogits^T @ x[chunk] (in fp32, cast once at the end), db += the
column sums. dx, dW and db are the gradients for an incoming gradient of 1: they are outputs of the op that
the autograd formula saves, and the backward only scales them by the loss's incoming gradient. A flag
that is False leaves that gradient out (an empty tensor; an inference graph passes all three False, and
then only the loss is computed).

Semantics are F.cross_entropy's with class indices: `ignore_index` rows contribute nothing; "mean" divides
by the number of rows not ignored; label smoothing ε mixes the one-hot target with ε/V per class. The loss
is accumulated in fp32 and returned in `out_dtype` (the dtype the replaced cross-entropy returned).

The per-chunk work is a few ATen ops (GEMMs, then in-place pointwise ops and row reductions on the chunk's
fp32 logits), device-agnostic: CPU and CUDA run the same code. Compiled graphs call the op as an extern.
"""
from __future__ import annotations

from typing import Optional

import torch

_REDUCTIONS = ("mean", "sum")


def chunk_rows_for(vocab: int, chunk_bytes: int) -> int:
    """Rows per chunk so that a chunk's fp32 logits take at most chunk_bytes (at least one row)."""
    return max(1, chunk_bytes // max(1, vocab * 4))


@torch.library.custom_op("ember::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
                         ignore_index: int, reduction: str, label_smoothing: float, chunk_rows: int,
                         out_dtype: torch.dtype, grad_x: bool, grad_weight: bool, grad_bias: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n, vocab = x.shape[0], weight.shape[0]
    valid = target != ignore_index
    safe_target = torch.where(valid, target, 0).unsqueeze(1)
    # every row's weight in the reduced loss: 1 (sum) or 1 / rows kept (mean), 0 on ignored rows; as a tensor,
    # so that the count never synchronizes with the host
    row_scale = valid.to(torch.float32)
    if reduction == "mean":
        row_scale = row_scale / valid.sum().to(torch.float32)
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x) if grad_x else x.new_empty(0)
    dweight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grad_weight else None
    dbias = torch.zeros(vocab, dtype=torch.float32, device=weight.device) if grad_bias else None
    wants_grads = grad_x or grad_weight or grad_bias
    for r in range(0, n, chunk_rows):
        xc = x[r:r + chunk_rows]
        logits = torch.mm(xc, weight.t()) if bias is None else torch.addmm(bias, xc, weight.t())
        z = logits.float() if logits.dtype != torch.float32 else logits
        del logits
        tc, scale = safe_target[r:r + chunk_rows], row_scale[r:r + chunk_rows]
        z_target = z.gather(1, tc).squeeze(1)
        z_sum = z.sum(1) if label_smoothing else None
        z_max = z.amax(1, keepdim=True)
        z.sub_(z_max)                       # z is now logits - max: exp(z) cannot overflow
        z.exp_()
        sum_exp = z.sum(1)
        lse = z_max.squeeze(1) + sum_exp.log()
        rows = lse - z_target
        if label_smoothing:
            rows = (1 - label_smoothing) * rows + label_smoothing * (lse - z_sum / vocab)
        total += (rows * scale).sum()
        if not wants_grads:
            continue
        # dloss/dlogits = (softmax - (1 - eps) onehot - eps / V) * row_scale
        z.div_(sum_exp.unsqueeze(1))
        if label_smoothing:
            z.sub_(label_smoothing / vocab)
        z.scatter_add_(1, tc, z.new_full(tc.shape, label_smoothing - 1))
        z.mul_(scale.unsqueeze(1))
        dz = z.to(x.dtype) if x.dtype != torch.float32 else z
        if grad_x:
            torch.mm(dz, weight, out=dx[r:r + chunk_rows])
        if grad_weight:
            dweight += torch.mm(dz.t(), xc)
        if grad_bias:
            dbias += z.sum(0)
    return (total.to(out_dtype), dx,
            dweight.to(weight.dtype) if grad_weight else weight.new_empty(0),
            dbias.to(bias.dtype) if grad_bias else weight.new_empty(0))


@linear_cross_entropy.register_fake
def _fake(x, weight, bias, target, ignore_index, reduction, label_smoothing, chunk_rows, out_dtype, grad_x,
          grad_weight, grad_bias):
    return (x.new_empty((), dtype=out_dtype), torch.empty_like(x) if grad_x else x.new_empty(0),
            torch.empty_like(weight) if grad_weight else weight.new_empty(0),
            torch.empty_like(bias) if grad_bias else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    _, dx, dweight, dbias = output
    ctx.mark_non_differentiable(dx, dweight, dbias)
    ctx.save_for_backward(dx, dweight, dbias)
    ctx.grads = inputs[9:12]


def _backward(ctx, grad_loss, *_unused):
    dx, dweight, dbias = ctx.saved_tensors
    grad_x, grad_weight, grad_bias = ctx.grads
    g = grad_loss.to(torch.float32)
    return (dx * g if grad_x else None, dweight * g if grad_weight else None, dbias * g if grad_bias else None,
            None, None, None, None, None, None, None, None, None)


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)
