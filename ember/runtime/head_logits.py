"""Logits returned beside a fused loss get their autograd outside the compiled graph.

A causal LM called with labels returns its logits with the loss; a training loop usually keeps the loss
and drops the logits. Inside one compiled graph the logits are an output that requires grad, so AOTAutograd
hands the backward a gradient for them whatever the program does with them: a materialized `[tokens,
vocab]` zero tensor when they are dropped, which the head's backward then multiplies twice (into dx and
dW), as large as the head's whole forward product, and as large in memory as the logits.

Where graph/passes/linear_cross_entropy.py has moved the loss into `ember::linear_cross_entropy`, the
graph returns its logits detached, and `wrap` gives them back their place in autograd here: `HeadLogits`
takes the graph's logits and the product's inputs (x, W, b) and computes the product's backward only
when something differentiates the logits. A dropped logits tensor never reaches the backward, so it costs
nothing there; one that is used gets the gradients eager would give it (x, W and b in the product's
dtype, cast back to their own, as autocast's casts do).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

Source = tuple[str, int]        # ("arg", i): the graph's i-th input; ("out", i): its i-th output


@dataclasses.dataclass(frozen=True)
class DeferredHead:
    outputs: tuple[int, ...]    # where the graph returns the head's logits, detached
    x: Source
    weight: Source
    bias: Optional[Source]


class HeadLogits(torch.autograd.Function):
    """logits = x @ W^T + b, computed already (the graph's output): only the backward is done here."""

    @staticmethod
    def forward(ctx, logits, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return logits.detach()      # a tensor of its own over the same memory, not a view the program can't write

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dtype = grad.dtype          # the product's: autocast's, where it cast x, W and b
        dx = dweight = dbias = None
        rows = grad.reshape(-1, grad.shape[-1])
        with torch.autocast(grad.device.type, enabled=False):
            if ctx.needs_input_grad[1]:
                dx = torch.matmul(grad, weight.to(dtype)).to(x.dtype)
            if ctx.needs_input_grad[2]:
                dweight = rows.t().mm(x.reshape(-1, x.shape[-1]).to(dtype)).to(weight.dtype)
            if ctx.needs_input_grad[3]:
                dbias = rows.sum(0).to(ctx.bias_dtype)
        return None, dx, dweight, dbias


def wrap(compiled, heads: list[DeferredHead], n_outputs: int):
    """`compiled` (the graph with the heads' extra outputs past the program's `n_outputs`) returning the
    program's outputs, each head's logits attached to autograd by HeadLogits."""
    if not heads:
        return compiled

    def run(*args):
        outs = compiled(*args)

        def take(source):
            if source is None:
                return None
            kind, i = source
            return args[i] if kind == "arg" else outs[i]

        kept = list(outs[:n_outputs])
        for head in heads:
            logits = HeadLogits.apply(outs[head.outputs[0]], take(head.x), take(head.weight), take(head.bias))
            for i in head.outputs:
                kept[i] = logits
        return tuple(kept) if isinstance(outs, tuple) else kept

    run.__wrapped__ = compiled
    return run
