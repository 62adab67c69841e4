"""Pre-grad pass: `F.cross_entropy(F.linear(x, W, b) ..., target)` -> `ember::linear_cross_entropy`, which
computes the loss and its gradients in chunks of rows, so that the `[rows, vocab]` logits, their fp32 copy,
their softmax and their gradient are never whole in memory (graph/linear_cross_entropy_op.py).

Why before AOTAutograd, on Dynamo's torch-level graph: there the head is still four recognizable calls
(`linear`, `.float()`, `.view(-1, V)`, `cross_entropy`), where the ATen joint graph has them decomposed
into a matmul, casts, `log_softmax`/`nll_loss` (or their decompositions) and a backward scattered over the
graph; and an op with its own autograd formula, traced by AOTAutograd, gives one extern call in the forward
and three multiplications in the backward, with only `dx`, `dW`, `db` saved between them.

What is matched, walking up from each `cross_entropy(input, target, ...)`:
  - `input` reaches a `linear(x, W, b)` through, in this order, row slices of the leading dims
    (`logits[..., :-1, :]`, applied to x too), casts to fp32 (`.float()`, `.to(torch.float32)`),
    `.contiguous()`, and views, reshapes or flattens that keep the last dim V (`.view(-1, V)`,
    `.flatten(0, 1)`, checked at every step of the walk): so the rows of
    cross_entropy's `[N, V]` input are the rows of `x.reshape(-1, H)` in order;
  - class-index targets (an integer tensor), no class weights, reduction "mean" or "sum", any
    `ignore_index` and label smoothing; the legacy size_average / reduce arguments leave it alone.
The linear's output dtype (bf16 under autocast) is the dtype the op multiplies in: x, W and b are cast to
it first, as autocast would. The loss keeps cross_entropy's result dtype. The gradient flags come from
`requires_grad` of the traced values (Dynamo guards on grad mode and on each input's requires_grad): an
inference graph computes the loss alone.

Where the logits are also read elsewhere (a model that returns them with the loss), the linear stays for
those readers and the op reads its chunks' logits from it rather than multiplying again. Logits that the
graph only returns are returned detached, and get their autograd outside the graph
(runtime/head_logits.py): inside it, AOTAutograd would hand the backward a materialized zero gradient for
them when the program drops them, and the backward would multiply it through the linear's backward.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import operator
from typing import Optional

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental import symbolic_shapes
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ... import config, metrics
from ...device import backend_for
from ...runtime import head_logits
from ..linear_cross_entropy_op import chunk_rows_for

log = logging.getLogger("ember")
_LINEARS = (torch._C._nn.linear, F.linear)
_CE_SIGNATURE = inspect.signature(F.cross_entropy)
_LINEAR_SIGNATURE = inspect.signature(lambda input, weight, bias=None: None)
_VIEW_METHODS = ("view", "reshape", "flatten")
_VIEW_FUNCTIONS = (torch.reshape, torch.flatten)
DEFERRED_HEADS = "ember_deferred_heads"     # gm.meta: the graph's runtime/head_logits.DeferredHead list
PROGRAM_OUTPUTS = "ember_program_outputs"   # gm.meta: how many outputs the program has, before the heads' own


def fuse_linear_cross_entropy(gm: torch.fx.GraphModule) -> None:
    if not config.fused_linear_cross_entropy:
        return
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is F.cross_entropy:
            if _rewrite(gm.graph, node):
                metrics.linear_cross_entropy_rewrites += 1


def _val(n):
    return n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else None


def _bind(signature, node: torch.fx.Node) -> Optional[dict]:
    try:
        bound = signature.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


def _is_float32_cast(n: torch.fx.Node) -> bool:
    if n.op != "call_method":
        return False
    if n.target == "float":
        return len(n.args) == 1 and not n.kwargs
    if n.target == "to":
        rest = list(n.args[1:]) + list(n.kwargs.values())
        return rest == [torch.float32] or (len(n.args) == 1 and list(n.kwargs) == ["dtype"]
                                           and n.kwargs["dtype"] is torch.float32)
    return False


def _is_row_slice(n: torch.fx.Node, ndim: int) -> bool:
    """`t[..., a:b, :]`-like indexing of the leading dims only, keeping the last dim whole."""
    if n.op != "call_function" or n.target is not operator.getitem or not isinstance(n.args[1], tuple):
        return False
    index = n.args[1]
    whole = slice(None, None, None)
    if not index or index[-1] != whole or len([i for i in index if i is not Ellipsis]) > ndim:
        return False
    return all(i is Ellipsis or (isinstance(i, slice) and all(isinstance(p, (int, type(None)))
                                                              for p in (i.start, i.stop, i.step)))
               for i in index)


def _chain(start: torch.fx.Node, vocab: int):
    """Walk up from cross_entropy's input to the linear: (the nodes walked, the linear last; the row slices,
    in order), or None."""
    walked, slices, n = [], [], start
    while True:
        v = _val(n)
        if not isinstance(v, torch.Tensor) or v.dim() < 1 or not statically_known_true(v.shape[-1] == vocab):
            return None
        walked.append(n)
        if n.op == "call_function" and n.target in _LINEARS:
            return walked, slices[::-1]
        if _is_float32_cast(n) or (n.op == "call_method" and n.target == "contiguous" and len(n.args) == 1):
            pass
        elif (n.op == "call_method" and n.target in _VIEW_METHODS) or (n.op == "call_function"
                                                                     and n.target in _VIEW_FUNCTIONS):
            if slices:          # a row slice after a view indexes the regrouped rows, not x's
                return None
        elif _is_row_slice(n, v.dim()):
            slices.append(n.args[1])
        else:
            return None
        if not n.args or not isinstance(n.args[0], torch.fx.Node):
            return None
        n = n.args[0]


def _rewrite(graph: torch.fx.Graph, ce: torch.fx.Node) -> bool:
    a = _bind(_CE_SIGNATURE, ce)
    if a is None or a["weight"] is not None or a["size_average"] is not None or a["reduce"] is not None:
        return False
    if a["reduction"] not in ("mean", "sum") or not isinstance(a["ignore_index"], int):
        return False
    if not isinstance(a["label_smoothing"], (int, float)):
        return False
    logits, target, loss = a["input"], a["target"], _val(ce)
    lv, tv = _val(logits), _val(target)
    if not (isinstance(lv, torch.Tensor) and isinstance(tv, torch.Tensor) and isinstance(loss, torch.Tensor)):
        return False
    if lv.dim() != 2 or tv.dim() != 1 or tv.dtype not in (torch.int64, torch.int32):
        return False
    found = _chain(logits, lv.shape[1])
    if found is None:
        return False
    walked, slices = found
    linear = walked[-1]
    la = _bind(_LINEAR_SIGNATURE, linear)
    if la is None:
        return False
    x, weight, bias = la["input"], la["weight"], la["bias"]
    xv, wv, bv, out = _val(x), _val(weight), _val(bias), _val(linear)
    if not all(isinstance(t, torch.Tensor) for t in (xv, wv, out)) or xv.dim() < 2 or wv.dim() != 2:
        return False
    if not out.dtype.is_floating_point or out.dtype == torch.float64:
        return False
    if bias is not None and not isinstance(bv, torch.Tensor):
        return False
    flags = [out.requires_grad and t is not None and t.requires_grad for t in (xv, wv, bv)]
    compute = out.dtype
    with graph.inserting_before(ce):
        def cast(n, v):
            return n if v.dtype == compute else graph.call_method("to", (n, compute))
        rows = x
        for index in slices:
            rows = graph.call_function(operator.getitem, (rows, index))
        rows = graph.call_function(torch.flatten, (cast(rows, xv), 0, -2)) if xv.dim() > 2 else cast(rows, xv)
        fused = graph.call_function(torch.ops.ember.linear_cross_entropy.default, (
            rows, cast(weight, wv), None if bias is None else cast(bias, bv), target,
            a["ignore_index"], a["reduction"], float(a["label_smoothing"]),
            _chunk_rows(lv.shape[1], out), _vocab_align(out), loss.dtype, *flags))
        new_loss = graph.call_function(operator.getitem, (fused, 0))
    ce.replace_all_uses_with(new_loss)
    # the logits chain stays where something else reads it (the logits returned with the loss)
    for n in [ce] + walked:
        if n.users:
            break
        graph.erase_node(n)
        if n is linear:
            return True
    # the logits exist anyway: the op reads its chunks from them instead of multiplying again
    with graph.inserting_before(fused):
        rows_of_logits = linear
        for index in slices:
            rows_of_logits = graph.call_function(operator.getitem, (rows_of_logits, index))
        if out.dim() > 2:
            rows_of_logits = graph.call_function(torch.flatten, (rows_of_logits, 0, -2))
    fused.args = fused.args + (rows_of_logits,)
    if any(flags):
        _defer_returned_logits(graph, linear, x, weight, bias)
    return True


def _defer_returned_logits(graph: torch.fx.Graph, linear: torch.fx.Node, x, weight, bias) -> None:
    """Logits the graph only returns (and hands the op) are returned detached, with what their backward
    needs, for runtime/head_logits.py to attach to autograd outside the graph: a program that drops
    them then runs no backward for them (no zero gradient, no two products)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = output.args[0]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not isinstance(outs, (tuple, list)) or linear not in outs:
        log.debug("ember: the logits of %s stay in autograd: the graph does not return them as they are", linear)
        return
    # every other reader of the logits is the op's row selection; none takes a gradient through them
    readers = [u for u in linear.users if u is not output]
    if len(readers) != 1 or not _reads_only_to_select_rows(readers[0]):
        log.debug("ember: the logits of %s stay in autograd: read by %s", linear, readers)
        return
    metrics.deferred_head_logits += 1
    with graph.inserting_after(linear):
        detached = graph.call_method("detach", (linear,))
    v = _val(linear)
    with v.fake_mode if hasattr(v, "fake_mode") else contextlib.nullcontext():
        detached.meta["example_value"] = v.detach()
    linear.replace_all_uses_with(detached, delete_user_cb=lambda u: u is not detached)
    outs, extra = output.args[0], []

    def source(node):
        if node is None:
            return None
        if node.op == "placeholder":
            return ("arg", placeholders.index(node))
        extra.append(node)
        return ("out", len(outs) + len(extra) - 1)

    head = head_logits.DeferredHead(tuple(i for i, o in enumerate(outs) if o is detached),
                                    source(x), source(weight), source(bias))
    graph.owning_module.meta.setdefault(PROGRAM_OUTPUTS, len(outs))
    graph.owning_module.meta.setdefault(DEFERRED_HEADS, []).append(head)
    output.args = (type(outs)(list(outs) + extra),)


def _reads_only_to_select_rows(n: torch.fx.Node) -> bool:
    """n is the op itself or the getitem / flatten chain that selects the op's rows of the logits."""
    while n.target is not torch.ops.ember.linear_cross_entropy.default:
        if n.target not in (operator.getitem, torch.flatten) or len(n.users) != 1:
            return False
        n = next(iter(n.users))
    return True


def _chunk_rows(vocab, logits) -> int:
    # a symbolic vocabulary's size as traced: the chunk size steers memory, never the result
    return chunk_rows_for(_size_hint(vocab), logits.element_size(), config.linear_cross_entropy_chunk_bytes)


def _vocab_align(logits) -> int:
    """The multiple to pad the vocabulary to: the device's matmul alignment for 16-bit GEMMs (float32 ones
    are never padded, as in post_grad.pad_matmuls)."""
    if logits.dtype not in (torch.float16, torch.bfloat16):
        return 1
    return max(1, backend_for(logits.device).matmul_alignment // logits.element_size())


def _size_hint(n) -> int:
    """An example value for a size (torch 2.13 has symbolic_shapes.optimization_hint; 2.11 the node's hint)."""
    if isinstance(n, int):
        return n
    fn = getattr(symbolic_shapes, "optimization_hint", None)
    if fn is not None:
        return int(fn(n))
    hint = n.node.hint
    return int(hint) if hint is not None else 8192      # unbacked: a typical vocabulary; only sizes a chunk
