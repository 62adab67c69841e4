"""A matmul's bias and activation applied by the GEMM library's epilogue.

`relu(addmm(bias, a, b))` and tanh-GELU of it (`gelu(..., approximate="tanh")`, or the formula Hugging Face's
`gelu_new` writes out) become one `aten._addmm_activation(bias, a, b, use_gelu=...)`, which cuBLASLt runs as
one GEMM whose epilogue adds the bias and applies the activation to the float32 accumulator before rounding.
On an H200 (bf16, 8192 x 3072 x 768, `python -m experiments.addmm_activation_probe`) that call takes 73 us
where the product with its bias takes 65 and eager's product plus GELU kernel 97; the result is closer to a
float64 reference than eager's, which rounds the product before the activation.

Only where that is all the product's value is used for: the product (and any reshape of it) has no other
reader, which in a training graph's forward excludes every product whose pre-activation the backward
needs; and no reader of the activation is pointwise, since ember's kernel of those readers would add the
bias and apply the activation in the pass over the product it makes anyway. The backend says which
activations its library fuses (`KernelBackend.library_bias_activations`), for 16-bit products whose K and N
are multiples of its matmul alignment (misaligned, cuBLASLt's GELU epilogue ran 3x slower than eager's two
kernels on that H200).
"""
from __future__ import annotations

import math

import torch
import torch.fx

from ...device import backend_for
from ..pattern import Pattern
from .common import RESHAPES, VIEW_OPS, call_op, is_pointwise, readers

aten = torch.ops.aten

_DTYPES = (torch.bfloat16, torch.float16)


def _tanh_gelu_formula(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# Hugging Face's NewGELUActivation (GPT-2's "gelu_new"): tanh-GELU written out, found but not rewritten here
TANH_GELU_FORMULA = Pattern(_tanh_gelu_formula, None, [torch.randn(8)], name="tanh_gelu_formula")


def _activations(gm: torch.fx.GraphModule) -> list:
    """[(the activation's result node, the node it reads, its nodes, kind)] for every relu and tanh-GELU."""
    found = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or not n.args or not isinstance(n.args[0], torch.fx.Node):
            continue
        if n.target is aten.relu.default:
            found.append((n, n.args[0], {n}, "relu"))
        elif n.target is aten.gelu.default and n.kwargs.get("approximate") == "tanh":
            found.append((n, n.args[0], {n}, "gelu_tanh"))
    if any(n.target is aten.tanh.default for n in gm.graph.nodes):
        for m in TANH_GELU_FORMULA.matches(gm):
            found.append((m.outputs[0], m["x"], set(m.nodes.values()), "gelu_tanh"))
    return found


def _product_under(x: torch.fx.Node, inside: set):
    """(the addmm node, the reshapes from it up to x, in order) where x is that addmm's result, through
    reshapes, read by nothing but `inside` (the activation's nodes); else None."""
    if not set(x.users) <= inside:
        return None
    reshapes = []
    while x.op == "call_function" and x.target in RESHAPES:
        reshapes.append(x)
        x = x.args[0]
        if not isinstance(x, torch.fx.Node) or len(x.users) != 1:
            return None
    if x.op != "call_function" or x.target is not aten.addmm.default or x.kwargs or len(x.args) != 3:
        return None
    return x, reshapes[::-1]


def _library_fuses(product: torch.fx.Node, kind: str) -> bool:
    bias, a, b, out = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None
                       for x in (*product.args, product))
    if not all(isinstance(t, torch.Tensor) for t in (bias, a, b, out)) or out.dtype not in _DTYPES:
        return False
    backend = backend_for(out.device)
    if kind not in backend.library_bias_activations or a.dim() != 2 or b.dim() != 2 or bias.dim() != 1:
        return False
    (m, k), n = a.shape, b.shape[1]
    if not all(isinstance(s, int) and s > 1 for s in (m, k, n)):      # cuBLASLt's epilogue wants M, K, N > 1
        return False
    aligned = backend.matmul_alignment // out.element_size() or 1
    return bias.dtype == out.dtype and bias.shape[0] == n and bias.stride() == (1,) and \
        a.dtype == b.dtype == out.dtype and k % aligned == 0 and n % aligned == 0


def fuse_bias_activations(gm: torch.fx.GraphModule) -> None:
    """relu / tanh-GELU of addmm's result -> `_addmm_activation`, where the backend's library fuses it."""
    fused = False
    for act, x, inside, kind in _activations(gm):
        found = _product_under(x, inside)
        if found is None or any(is_pointwise(u) for u in readers(act, VIEW_OPS)):
            continue
        product, reshapes = found
        if not _library_fuses(product, kind):
            continue
        with gm.graph.inserting_before(act):
            new = call_op(gm.graph, aten._addmm_activation.default, *product.args, use_gelu=kind == "gelu_tanh")
            for r in reshapes:
                new = call_op(gm.graph, r.target, new, *r.args[1:])
        new.meta["stack_trace"] = act.meta.get("stack_trace")
        act.replace_all_uses_with(new)
        fused = True
    if fused:           # the activations and products replaced, before later passes look at them
        gm.graph.eliminate_dead_code()
