"""Matrix products: mm, bmm and addmm as GEMM templates (ir/template.py) where the device's kernel backend
renders them and ember.config.gemm_templates asks for them; otherwise (raising Unsupported) an ATen call.

"auto" uses templates where the backend times them against the library call at first call (its `tunes`);
"always" wherever the backend has templates; "never" nowhere. The template covers static sizes, float32
(TF32 as torch.backends.cuda.matmul.allow_tf32 says), float16 and bfloat16. addmm is the template's product
plus a pointwise `beta * bias + alpha * product`, which the scheduler fuses into the template's epilogue
(a 16-bit product is rounded before the bias is added, as ember's unfused addmm on a GPU does:
graph/passes/post_grad.py, unfuse_bias_addmm).
"""
from __future__ import annotations

import sympy
import torch

from .. import state
from ..config import config
from ..device import backend_for
from ..ir.nodes import TensorBox
from ..ir.ops import ops
from ..ir.template import TemplateBuffer
from .fallback import realize_arg
from .pointwise import pointwise
from .registry import Unsupported, lower

aten = torch.ops.aten

TEMPLATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _wants_template(a, b) -> bool:
    """Do ember.config.gemm_templates and the backend ask for a template for a @ b (2-D or batched)?"""
    mode = config.gemm_templates
    backend = backend_for(a.get_device())
    if mode == "never" or not backend.gemm_templates or (mode == "auto" and not backend.tunes):
        return False
    dtype, sizes = a.get_dtype(), [*a.get_size(), *b.get_size()]
    # M, N (and the batch) of at least one; K may be 0 (the product is then zeros)
    nonempty = [*a.get_size()[:-1], b.get_size()[-1]]
    return dtype in TEMPLATE_DTYPES and b.get_dtype() == dtype and \
        all(isinstance(s, sympy.Integer) for s in sizes) and all(int(s) > 0 for s in nonempty)


def _static_layout(x) -> bool:
    l = x.layout
    return all(isinstance(v, sympy.Integer) for v in (*l.size, *l.stride, l.offset))


def _product(a: TensorBox, b: TensorBox, batched: bool) -> TensorBox:
    if not _wants_template(a, b):
        raise Unsupported("matrix product outside the GEMM template")
    node = state.current_graph().current_node
    metas = [x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in node.args[-2:]] \
        if node is not None else [None, None]
    sa, sb = realize_arg(a, metas[0]), realize_arg(b, metas[1])
    if not (_static_layout(sa) and _static_layout(sb)):
        raise Unsupported("GEMM template operands with symbolic layouts")
    return TensorBox(state.current_graph().register_buffer(TemplateBuffer.matmul(sa, sb, batched)))


@lower(aten.mm.default)
def mm(a, b):
    return _product(a, b, batched=False)


@lower(aten.bmm.default)
def bmm(a, b):
    return _product(a, b, batched=True)


@lower(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    if not _wants_template(a, b) or bias.get_dtype() != a.get_dtype():
        raise Unsupported("addmm outside the GEMM template")
    product = _product(a, b, batched=False)

    def combine(c, p):
        p = p if alpha == 1 else ops.mul(p, ops.constant(alpha, torch.float32))
        if beta == 0:         # eager ignores the bias then, NaN and Inf included
            return p
        return ops.add(c if beta == 1 else ops.mul(c, ops.constant(beta, torch.float32)), p)
    return pointwise(combine, bias, product)
