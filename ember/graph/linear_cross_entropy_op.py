"""`ember::linear_cross_entropy`: cross-entropy of a linear layer's output, computed in chunks of rows so that
the `[rows, vocab]` logits, their fp32 log-probabilities and their gradient exist only one chunk at a time
(the approach of Liger-Kernel's fused linear cross-entropy). `graph/passes/linear_cross_entropy.py` rewrites
`F.cross_entropy(F.linear(x, W, b) [.float()] [.view(-1, V)], target, ...)` into it.

    linear_cross_entropy(x[N, H], weight[V, H], bias[V]?, target[N], ignore_index, reduction, label_smoothing,
                         chunk_rows, vocab_align, out_dtype, grad_x, grad_weight, grad_bias, logits[N, V]?)
        -> (loss, dx[N, H], dweight[V, H], dbias[V])

For each chunk of rows the forward computes the logits (one GEMM in the inputs' dtype), each row's loss from
its log-probabilities in fp32, and the gradient of the loss w.r.t. the chunk's logits, softmax - (1 - eps)
onehot - eps / V, written in x's dtype; it spends that gradient at once: dx[chunk] = dlogits @ W,
dW += dlogits^T @ x[chunk] (accumulated in fp32, cast once at the end), db += its column sums. An ignored
row's loss and logit gradient are 0 as they are computed, so it adds nothing to dx, dW or db, and the
reduction's scale (1 or 1 / rows kept) is applied once at the end: a chunk costs its three GEMMs (logits, dx,
dW) and, on CUDA, one kernel; nothing else.

`logits`, when given, are x @ W^T + b as the graph computed them for another reader (a model that returns
its logits with the loss): a chunk then reads its rows from them instead of multiplying again, and writes
its gradient into a chunk-sized buffer, never over them.

dx, dW and db are the gradients for an incoming gradient of 1: outputs of the op, which the autograd
formula saves; the backward only scales them by the loss's incoming gradient. A flag that is False leaves
that gradient out (an empty tensor); an inference graph passes all three False and only the loss is
computed.

`vocab_align` > 1 pads the vocabulary (W's rows, b) with zeros to a multiple of it, for GEMMs whose
16-bit rows are aligned (cuBLAS runs misaligned leading dimensions several times slower: see
post_grad.pad_matmuls); the padding's logits are set to -inf, so they take no share of the softmax and
get no gradient. Semantics are F.cross_entropy's with class indices: `ignore_index` rows contribute
nothing; "mean" divides by the number of rows not ignored (NaN when there are none, as eager); label
smoothing eps mixes the one-hot target with eps / V per class. The loss is accumulated in fp32 and returned
in `out_dtype` (the dtype the replaced cross-entropy returned). Compiled graphs call the op as an extern. A
chunk's loss and logit gradient run as one Triton kernel on CUDA (runtime/cross_entropy_rows.py), as ATen
ops elsewhere; the GEMMs are ATen's everywhere.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..runtime import cross_entropy_rows


def chunk_rows_for(vocab: int, itemsize: int, chunk_bytes: int) -> int:
    """Rows per chunk so that a chunk's working set, its logits (itemsize bytes each) and their fp32
    log-probabilities, takes at most chunk_bytes (at least one row)."""
    return max(1, chunk_bytes // max(1, vocab * (itemsize + 4)))


@torch.library.custom_op("ember::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
                         ignore_index: int, reduction: str, label_smoothing: float, chunk_rows: int,
                         vocab_align: int, out_dtype: torch.dtype, grad_x: bool, grad_weight: bool, grad_bias: bool,
                         logits: Optional[torch.Tensor] = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n, vocab = x.shape[0], weight.shape[0]
    if logits is not None and logits.stride(-1) != 1:
        logits = logits.contiguous()
    target = target.contiguous()        # the kernels read a row's target at target + row
    eps = label_smoothing
    if logits is not None and (grad_x or grad_weight or grad_bias) and cross_entropy_rows.usable(x):
        return _given_logits_by_columns(x, weight, bias, logits, target, ignore_index, reduction, eps, out_dtype,
                                        chunk_rows * vocab, grad_x, grad_weight, grad_bias)
    padded = vocab + (-vocab % vocab_align if vocab_align > 1 else 0)
    w = torch.nn.functional.pad(weight, (0, 0, 0, padded - vocab)) if padded != vocab else weight
    b = torch.nn.functional.pad(bias, (0, padded - vocab)) if bias is not None and padded != vocab else bias
    valid = target != ignore_index
    in_kernel = cross_entropy_rows.usable(x)
    if not in_kernel:
        safe_target = torch.where(valid, target, 0).unsqueeze(1)
        keep = valid.to(x.dtype).unsqueeze(1)       # 1 on rows that count, 0 on ignored rows
    losses = torch.empty((n, 1), dtype=torch.float32, device=x.device)     # each row's, 0 where ignored
    dx = torch.empty_like(x) if grad_x else x.new_empty(0)
    dweight = torch.zeros((padded, weight.shape[1]), dtype=torch.float32, device=weight.device) if grad_weight else None
    dbias = torch.zeros(padded, dtype=torch.float32, device=weight.device) if grad_bias else None
    wants_grads = grad_x or grad_weight or grad_bias
    # every chunk's view of each per-row tensor, made at once (one call per tensor, not one per chunk)
    chunks = {name: t.split(chunk_rows) for name, t in (("x", x), ("target", target), ("losses", losses),
                                                        ("dx", dx if grad_x else None), ("logits", logits))
              if t is not None}
    if not in_kernel:
        chunks.update(safe_target=safe_target.split(chunk_rows), keep=keep.split(chunk_rows))
    for i, xc in enumerate(chunks["x"]):
        # each row's loss, and with gradients wanted dloss/dlogits of each row, unscaled: softmax - (1 - eps)
        # onehot - eps / V, in x's dtype; an ignored row's are 0, so it adds nothing to dx, dW or db
        given = chunks["logits"][i] if logits is not None else None
        if in_kernel and given is None:         # the gradient written over the chunk's logits
            dz = _logits(xc, w, b)
            cross_entropy_rows.loss_and_grad(dz, chunks["target"][i], vocab, eps, wants_grads,
                                             ignore_index=ignore_index, loss=chunks["losses"][i])
        elif in_kernel:         # the loss alone: with gradients the op goes by columns
            cross_entropy_rows.loss_and_grad(given, chunks["target"][i], vocab, eps, False,
                                             ignore_index=ignore_index, loss=chunks["losses"][i])
            dz = None
        else:       # the logits are freed inside once their log-probabilities exist
            chunk = _logits(xc, w, b) if given is None else torch.nn.functional.pad(given, (0, padded - vocab))
            rows, dz = _chunk_in_aten(chunk, chunks["safe_target"][i], chunks["keep"][i], vocab, padded, eps,
                                      x.dtype, wants_grads)
            chunks["losses"][i].copy_(rows)
        if not wants_grads:
            continue
        if grad_x:
            torch.mm(dz, w, out=chunks["dx"][i])
        if grad_weight:
            _accumulate_product(dweight, dz.t(), xc)
        if grad_bias:
            dbias += dz.sum(0, dtype=torch.float32)
    total = losses.sum()
    # the reduction's scale, applied once: 1 (sum) or 1 / rows that count (mean)
    scale = 1.0 / valid.sum().to(torch.float32) if reduction == "mean" else None
    if scale is not None:
        total = total * scale
    return (total.to(out_dtype),
            dx.mul_(scale) if grad_x and scale is not None else dx,
            _finish(dweight, vocab, scale, weight.dtype) if grad_weight else weight.new_empty(0),
            _finish(dbias, vocab, scale, weight.dtype) if grad_bias else weight.new_empty(0))


def _given_logits_by_columns(x, weight, bias, logits, target, ignore_index, reduction, eps, out_dtype,
                             chunk_elements, grad_x, grad_weight, grad_bias):
    """The op on CUDA with the logits given: chunks of columns, not rows. The rows' log-sum-exps and losses
    come from one pass over the logits; then each chunk of vocabulary columns gets its gradient (scaled,
    ignored rows zeroed) for all rows at once, which gives its rows of dW in one product, in W's dtype, and
    adds its share to dx (fp32, [N, H]): the accumulated gradient is x's, not W's, which is V / N times
    larger for an LM head, and W needs no padding (every chunk's width is a multiple of 16)."""
    n, vocab = x.shape[0], weight.shape[0]
    valid = target != ignore_index
    safe_target = torch.where(valid, target, 0)
    lse = torch.empty(n, dtype=torch.float32, device=x.device)
    total = cross_entropy_rows.loss_and_grad(logits, target, vocab, eps, False, None, lse,
                                             ignore_index=ignore_index).sum()
    row_scale = valid.to(torch.float32)
    if reduction == "mean":
        scale = 1.0 / valid.sum().to(torch.float32)
        total, row_scale = total * scale, row_scale * scale
    dx = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if grad_x else None
    dweight = torch.empty_like(weight) if grad_weight else weight.new_empty(0)
    dbias = torch.empty(vocab, dtype=torch.float32, device=x.device) if grad_bias else None
    width = min(max(16, chunk_elements // max(1, n) // 16 * 16), -(-vocab // 16) * 16)
    buffer = torch.empty((n, width), dtype=x.dtype, device=x.device)
    for first in range(0, vocab, width):
        columns = min(width, vocab - first)
        dz = buffer[:, :columns]
        cross_entropy_rows.columns_grad(logits, lse, safe_target, row_scale, dz, first, vocab, eps)
        if grad_weight:
            torch.mm(dz.t(), x, out=dweight[first:first + columns])
        if grad_x:
            _accumulate_product(dx, dz, weight[first:first + columns])
        if grad_bias:
            dbias[first:first + columns] = dz.sum(0, dtype=torch.float32)
    return (total.to(out_dtype), dx.to(x.dtype) if grad_x else x.new_empty(0), dweight,
            dbias.to(weight.dtype) if grad_bias else weight.new_empty(0))


def _accumulate_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc in fp32: in place where the library multiplies 16-bit operands into an fp32
    output (cuBLAS, `aten::addmm.dtype_out`), else through a product in the operands' dtype."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda and hasattr(torch.ops.aten.addmm, "dtype_out"):
        torch.ops.aten.addmm.dtype_out(acc, a, b, acc.dtype, out=acc)
    else:
        acc += torch.mm(a, b)


def _logits(xc: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.mm(xc, w.t()) if b is None else torch.addmm(b, xc, w.t())


def _chunk_in_aten(logits, tc, keep, vocab: int, padded: int, eps: float, dtype: torch.dtype, wants_grads: bool):
    """(each row's loss [rows, 1] in fp32, dloss/dlogits in `dtype` or None) of one chunk, in ATen ops; both
    0 on the rows that `keep` (1 or 0 per row, in `dtype`) leaves out."""
    if padded != vocab:
        logits[:, vocab:] = float("-inf")   # the padding's columns: no share of the softmax
    log_probs = torch.log_softmax(logits, 1, dtype=torch.float32)
    del logits
    lp_target = log_probs.gather(1, tc)
    rows = -lp_target
    if eps:
        rows = (1 - eps) * rows - (eps / vocab) * log_probs[:, :vocab].sum(1, keepdim=True)
    rows = rows * keep
    if not wants_grads:
        return rows, None
    # the target's column is written from fp32 so that it is rounded once
    if dtype == torch.float32:
        dz = log_probs.exp_()
    else:
        dz = torch.exp(log_probs, out=torch.empty(log_probs.shape, dtype=dtype, device=log_probs.device))
    if eps:
        dz.sub_(eps / vocab)
        dz[:, vocab:] = 0
    dz.scatter_(1, tc, (lp_target.exp() - (1 - eps) - eps / vocab).to(dtype))
    return rows, dz.mul_(keep)


def _finish(grad: torch.Tensor, vocab: int, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """A gradient accumulated in fp32 over the padded vocabulary: its first `vocab` rows, scaled, in dtype."""
    if scale is not None:
        grad.mul_(scale)
    return grad[:vocab].to(dtype)


@linear_cross_entropy.register_fake
def _fake(x, weight, bias, target, ignore_index, reduction, label_smoothing, chunk_rows, vocab_align, out_dtype,
          grad_x, grad_weight, grad_bias, logits=None):
    return (x.new_empty((), dtype=out_dtype), torch.empty_like(x) if grad_x else x.new_empty(0),
            torch.empty_like(weight) if grad_weight else weight.new_empty(0),
            torch.empty_like(bias) if grad_bias else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    _, dx, dweight, dbias = output
    ctx.mark_non_differentiable(dx, dweight, dbias)
    ctx.save_for_backward(dx, dweight, dbias)
    ctx.grads = inputs[10:13]


def _backward(ctx, grad_loss, *_unused):
    dx, dweight, dbias = ctx.saved_tensors
    grad_x, grad_weight, grad_bias = ctx.grads
    g = grad_loss.to(torch.float32)
    return (dx * g if grad_x else None, dweight * g if grad_weight else None, dbias * g if grad_bias else None,
            None, None, None, None, None, None, None, None, None, None, None)


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)
