"""Passes on the functional ATen graph that compile_graph lowers (forward, backward or inference).

A pass that finds a fixed subgraph is a `Pattern` (graph/pattern.py): the subgraph and its replacement
written as PyTorch functions, the conditions as its extra_check. `scatter_into_constant` and
`pad_matmuls` build what they insert from the sizes of what they match, so they walk the graph in code.
What the kernel backend prefers (ember/device.py: KernelBackend) the passes ask `backend_for(device)`."""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx

from ... import config
from ...device import backend_for
from ..custom_ops import (chunk_padded_mm, chunk_padded_mm_copies, chunk_padded_mm_pair, chunk_padded_mm_pair_copies,
                          padded_mm, softmax_stats)
from ..pattern import Pattern, fill_fake_values
from .attention import fuse_attention_inference
from .bucket_collectives import bucket_collectives
from .inplace_collectives import reinplace_all_reduces
from .common import RESHAPES, VIEW_OPS, call_op, dead_code_elimination, is_pointwise, readers, run_passes, size_arg
from .library_epilogues import fuse_bias_activations
from .conv_layout import plan_conv_layouts

aten = torch.ops.aten
prims = torch.ops.prims
# gm.meta[GRAPH_KIND]: "forward", "backward" or "inference", set by compile_graph before the passes run
GRAPH_KIND = "ember_graph_kind"


# -- casts to the dtype a value already has ---------------------------------------------------------------

def _cast(x, dtype):
    return prims.convert_element_type.default(x, dtype)


def _uncast(x, dtype):
    return x


# a cast to the dtype a value already has is the value (the dtype is a literal input: any dtype matches)
remove_noop_casts = Pattern(_cast, _uncast, [torch.randn(2), torch.float16], name="remove_noop_casts",
                            extra_check=lambda match: getattr(_val(match["x"]), "dtype", None) == match["dtype"])


# -- Dynamo's fused multiply-adds, as the ops they came from ---------------------------------------------

def restore_multiply_adds(gm: torch.fx.GraphModule) -> None:
    """Dynamo traces `x.addcmul_(a, b, value=v)` as `fma(a * b, v, x)`, `x.addcdiv_(a, b, value=v)` as
    `fma(a / b, v, x)` and `x.add_(y, alpha=tensor)` as `fma(y, alpha, x)`, with torch._inductor's
    `prims.fma` (ember has no lowering of it: an ATen call whose reference rounds `a * b` to a 16-bit
    dtype, as does the materialized product). Rewritten to addcmul / addcdiv / add, which ember lowers
    and computes as eager's kernels do, rounding once. (Code, not a Pattern: `prims.fma` exists only once
    Dynamo has imported it.)"""
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or str(n.target) != "prims.fma.default" or n.kwargs:
            continue
        product, factor, addend = n.args
        out = _val(n)
        if out is None:
            continue
        with gm.graph.inserting_before(n):
            new = _multiply_add(gm.graph, product, factor, addend, out.dtype)
        if new is not None and _val(new) is not None and _val(new).dtype == out.dtype:
            new.meta["stack_trace"] = n.meta.get("stack_trace")
            n.replace_all_uses_with(new)
            gm.graph.erase_node(n)


def _multiply_add(graph, product, factor, addend, dtype):
    """addend + product * factor as an op ember lowers, or None; `product` alone when it is a product or
    a quotient of two values of `dtype` read nowhere else, folded into addcmul / addcdiv."""
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        ops = {aten.mul.Tensor: aten.addcmul.default, aten.div.Tensor: aten.addcdiv.default}
        if isinstance(product, torch.fx.Node) and product.target in ops and len(product.users) == 1 and \
                not product.kwargs and all(getattr(_val(x), "dtype", None) == dtype for x in product.args):
            return call_op(graph, ops[product.target], addend, *product.args, value=factor)
        return call_op(graph, aten.add.Tensor, addend, product, alpha=factor)
    if isinstance(factor, torch.fx.Node):
        return call_op(graph, aten.addcmul.default, addend, product, factor)
    return None


# -- a scatter into a constant tensor -------------------------------------------------------------------

_CONSTANT_FILLS = {aten.zeros_like.default: 0, aten.zeros.default: 0, aten.ones_like.default: 1,
                   aten.ones.default: 1, aten.full_like.default: None, aten.full.default: None}


def _constant_fill(node):
    """The scalar a tensor-creating node fills with, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _CONSTANT_FILLS:
        return None
    fill = _CONSTANT_FILLS[node.target]
    return node.args[1] if fill is None and len(node.args) > 1 else fill


def scatter_into_constant(gm: torch.fx.GraphModule) -> None:
    """`full(c).scatter(dim, index, v)` with one index per row (index of size 1 along dim and the
    output's size elsewhere) is `where(arange(n) == index, v, c)`: a pointwise that fuses into its
    consumers instead of a materialized tensor. Cross-entropy's backward scatters -1 into a
    [tokens, vocabulary] float32 zeros tensor this way. (Code, not a Pattern: the constant comes from any
    of six creation ops, and the arange spans the output's size along dim.)"""
    for n in list(gm.graph.nodes):
        found = _scatter_of_one_per_row(n)
        if found is not None:
            _scatter_as_where(gm, n, *found)


def _scatter_of_one_per_row(node):
    """(fill, dim) where node scatters one value per row into a constant `fill` along `dim`, else None."""
    if node.op != "call_function" or node.target is not aten.scatter.value or node.kwargs:
        return None
    base, dim, index, _ = node.args
    fill, out, idx = _constant_fill(base), node.meta.get("val"), _val(index)
    if fill is None or out is None or idx is None or idx.dim() != out.dim() or out.dim() == 0:
        return None
    dim = dim % out.dim()
    if idx.shape[dim] != 1 or any(idx.shape[d] != out.shape[d] for d in range(out.dim()) if d != dim):
        return None
    return fill, dim


def _scatter_as_where(gm: torch.fx.GraphModule, node: torch.fx.Node, fill, dim: int) -> None:
    """Replace node, `constant(fill).scatter(dim, index, value)`, by `where(arange == index, value, fill)`."""
    base, _, index, value = node.args
    out, g = node.meta["val"], gm.graph
    shape = [1] * out.dim()
    with g.inserting_before(node):
        # the constant's size, read from it (a symbolic size as a node): the constant itself is never stored
        shape[dim] = size_arg(g, base, dim)
        iota = g.call_function(aten.arange.start_step, (0, shape[dim], 1),
                               {"dtype": _val(index).dtype, "device": out.device})
        hit = g.call_function(aten.eq.Tensor, (g.call_function(aten.view.default, (iota, shape)), index))
        scalars = [g.call_function(aten.full.default, ([], x), {"dtype": out.dtype, "device": out.device})
                   for x in (value, fill)]
        where = g.call_function(aten.where.self, (hit, *scalars))
    node.replace_all_uses_with(where)
    g.erase_node(node)
    fill_fake_values(gm, [iota, hit.args[0], hit, *scalars, where])


# -- softmax's row statistics in one reduction ----------------------------------------------------------

def _softmax_rows(x, dim):
    m = torch.amax(x, dim, keepdim=True)
    shifted = x - m
    e = torch.exp(shifted)
    return m, shifted, e, torch.sum(e, dim, keepdim=True)


def _softmax_rows_online(x, dim):
    m, total = softmax_stats(x, dim)
    shifted = x - m
    e = torch.exp(shifted)
    return m, shifted, e, total


def _rows_read_online(match) -> bool:
    val = _val(match["x"])
    return val is not None and val.dtype in (torch.float32, torch.float64) and val.dim() > 0 and \
        backend_for(val.device).reads_rows_online


# `m = amax(x, d, keepdim)` and `sum(exp(x - m), d, keepdim)`, the row statistics of softmax, log-softmax
# and cross-entropy, become one `ember::softmax_stats(x, d)`: one reduction carrying the running max and
# the sum of exp rescaled to it, so a row too long to hold in registers is read once, not once for the max
# and again for the sum, where the kernel backend wants that (reads_rows_online). Float32/64 rows only
# (narrow floats are upcast first by the decompositions, and the statistics' dtype must be x's). x - m and
# its exp are returned too: softmax divides by the sum, log-softmax subtracts its log from x - m.
online_softmax_stats = Pattern(_softmax_rows, _softmax_rows_online, [torch.randn(4, 8), -1],
                               extra_check=_rows_read_online, name="online_softmax_stats")


# -- a matmul's bias added where its result is read -----------------------------------------------------

def _feeds_pointwise_only(node) -> bool:
    """Do all of node's readers (through reshapes) compute elementwise (ATen's pointwise tag)?"""
    found = readers(node)
    return bool(found) and all(is_pointwise(u) for u in found)


def _addmm(bias, a, b):
    return torch.addmm(bias, a, b)


def _mm_then_bias(bias, a, b):
    return torch.mm(a, b) + bias


def _bias_fits_epilogue(match) -> bool:
    product, out, bias = match.outputs[0], _val(match.outputs[0]), _val(match["bias"])
    return out is not None and bias is not None and bias.dim() == 1 and bias.dtype == out.dtype and \
        backend_for(out.device).adds_matmul_bias_in_epilogue and _feeds_pointwise_only(product)


# `addmm(bias, a, b)` whose result only feeds pointwise ops is `mm(a, b) + bias`: the add (and autocast's
# cast of the bias) then runs in the kernel of those ops, which reads the product anyway, instead of as a
# separate cast kernel before the GEMM (adds_matmul_bias_in_epilogue). A 16-bit product is then rounded
# before the bias is added, as inductor's does.
unfuse_bias_addmm = Pattern(_addmm, _mm_then_bias, [torch.randn(8), torch.randn(4, 3), torch.randn(3, 8)],
                            extra_check=_bias_fits_epilogue, name="unfuse_bias_addmm")


def unfuse_convolution_bias(gm: torch.fx.GraphModule) -> None:
    """`convolution(x, w, bias)` is `convolution(x, w) + bias` where the device's backend adds a
    convolution's bias in its own kernels (`adds_convolution_bias_in_epilogue`): the convolution library
    adds a bias as a separate elementwise pass over the output (cuDNN in NHWC: 22 of ConvNeXt-T's kernels,
    ~10% of its inference step on an H200), while ember's kernel that reads the output next adds it for
    free. A 16-bit output is then rounded before the bias is added, as inductor's is. In the backward,
    `convolution_backward` no longer computes the bias gradient (ATen's separate reduction over the
    gradient: 22 kernels, 0.95 ms of ConvNeXt-T's training step at batch 64 on an H100): it is the sum of
    the output's gradient over every dim but the channels, reduced by ember's kernels."""
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is aten.convolution_backward.default:
            _sum_bias_gradient(gm.graph, n)
        if n.op != "call_function" or n.target is not aten.convolution.default:
            continue
        bias, out = n.args[2], _val(n)
        b = _val(bias)
        if not isinstance(out, torch.Tensor) or not isinstance(b, torch.Tensor) or b.dim() != 1 or \
                b.dtype != out.dtype or not backend_for(out.device).adds_convolution_bias_in_epilogue:
            continue
        with gm.graph.inserting_before(n):
            conv = call_op(gm.graph, aten.convolution.default, n.args[0], n.args[1], None, *n.args[3:])
            shaped = call_op(gm.graph, aten.view.default, bias, [-1] + [1] * (out.dim() - 2))
            added = call_op(gm.graph, aten.add.Tensor, conv, shaped)
        added.meta["val"] = out          # the traced strides (a fake add may pick others)
        n.replace_all_uses_with(added)
        gm.graph.erase_node(n)


def _sum_bias_gradient(graph: torch.fx.Graph, n: torch.fx.Node) -> None:
    """convolution_backward(..., output_mask=[a, b, True]) -> convolution_backward(..., [a, b, False]) and
    the bias gradient as sum(grad_output) over every dim but dim 1, where the backend adds biases itself."""
    grad, mask = n.args[0], list(n.args[10])
    g = _val(grad)
    getters = {u.args[1]: u for u in n.users if u.target is operator.getitem}
    if not mask[2] or len(getters) != len(n.users) or 2 not in getters or not isinstance(g, torch.Tensor) or \
            not backend_for(g.device).adds_convolution_bias_in_epilogue:
        return
    bias_grad = _val(getters[2])
    if not isinstance(bias_grad, torch.Tensor) or bias_grad.dtype != g.dtype or \
            (len(getters) > 1 and not (mask[0] or mask[1])):
        return
    with graph.inserting_before(n):
        summed = call_op(graph, aten.sum.dim_IntList, grad, [d for d in range(g.dim()) if d != 1])
        rest = None
        if mask[0] or mask[1]:
            rest = call_op(graph, aten.convolution_backward.default, *n.args[:10], [mask[0], mask[1], False])
    getters[2].replace_all_uses_with(summed)
    graph.erase_node(getters[2])
    for k, getter in getters.items():
        if k != 2:
            getter.args = (rest, k)
    graph.erase_node(n)


# -- matmuls padded to the device's alignment -------------------------------------------------------------

# A matmul below this many multiply-adds keeps its sizes: the padded copies would cost about what the
# misaligned GEMM loses
PAD_MATMUL_MIN_MACS = 2 ** 31
# With config.chunked_input_pads, an input operand of this size or more is not padded whole: its product
# copies a chunk of it at a time into an aligned buffer (ember::chunk_padded_mm). A backward graph's
# incoming gradient stays referenced by the autograd call while the graph runs, so a padded copy of GPT-2's
# logits gradient (8192 x 50257 bf16) is a second 0.77 GB buffer at the training step's peak
PAD_INPUT_WHOLE_MAX_BYTES = 256 << 20
# 16-bit floats only: cuBLAS may run a padded float32 GEMM with TF32-sized relative error (~5e-4) where the
# unpadded one has float32's (docs/performance.md; tests/test_passes.py on the GPU): a cuBLAS choice we do
# not control, so float32 keeps its sizes
_PADDED_MATMUL_DTYPES = (torch.bfloat16, torch.float16)


def pad_matmuls(gm: torch.fx.GraphModule) -> None:
    """A large mm/addmm whose M, K or N is not a multiple of the device's matmul alignment
    (KernelBackend.matmul_alignment) runs on zero-padded operands and its result is sliced back:
    zeros added along K add nothing, rows or columns added along M or N are sliced off. cuBLAS runs
    misaligned leading dimensions with slow kernels: GPT-2's LM head (N = 50257) takes several times the
    aligned GEMM's time plus the copies (docs/performance.md, "cuBLAS runs misaligned leading dimensions
    slowly").

    The pads are ember's pointwise kernels. An operand computed in the graph is padded where it is
    computed, and its other readers read the padded tensor sliced back: its producer then writes the
    padded form directly and the unpadded one is never stored (GPT-2's and BERT's logits gradient feeds
    both gradient matmuls and the bias gradient). An input (a weight) is padded right before the matmul.
    With config.chunked_input_pads, an input of the graph of PAD_INPUT_WHOLE_MAX_BYTES or more (a
    backward's logits gradient) is padded a chunk at a time inside its product (`ember::chunk_padded_mm`):
    the input itself stays alive while the graph runs, so a whole padded copy sits beside it. Where it feeds
    two products, as is and transposed (an LM head's input and weight gradients), both are one
    `ember::chunk_padded_mm_pair`, which copies each column chunk once for both.
    A result padded along N that a forward graph returns must come out dense (the backward reads saved
    outputs by eager's strides): `ember::padded_mm` computes it in row chunks, so no whole padded product
    sits beside the dense copy. An inference graph returns the padded product's view as it is, with the
    padded row stride, as inductor does: no copy, no chunks (row chunks run back to back and cost more
    than the whole product: docs/performance.md; `python -m scripts.profile_model gpt2 infer --view host`)."""
    padder = _MatmulPadder(gm.graph, inference=gm.meta.get(GRAPH_KIND) == "inference")
    found = [(n, s) for n in list(gm.graph.nodes) if (s := _misaligned_matmul(n)) is not None]
    paired = padder.rewrite_pairs(found) if config.chunked_input_pads else set()
    for n, sizes in found:
        if n not in paired:
            padder.rewrite(n, sizes)


@dataclasses.dataclass(frozen=True)
class _MatmulSizes:
    """A matmul's result size (M, N), and the zeros that align its M, K and N."""
    m: int
    n: int
    pad_m: int
    pad_k: int
    pad_n: int


def _misaligned_matmul(node) -> "_MatmulSizes | None":
    """node's sizes where it is a large 16-bit mm/addmm with static sizes off the device's matmul alignment."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    va, vb = _val(node.args[-2]), _val(node.args[-1])
    if va is None or vb is None or not all(isinstance(d, int) for d in (*va.shape, *vb.shape)):
        return None
    if va.dtype not in _PADDED_MATMUL_DTYPES:
        return None
    if node.target is aten.addmm.default and (not isinstance(node.args[0], torch.fx.Node) or
                                             node.args[0].meta["val"].dim() != 1):
        return None
    align = backend_for(va.device).matmul_alignment // va.element_size()
    (m, k), n = va.shape, vb.shape[1]
    if align <= 1 or m * k * n < PAD_MATMUL_MIN_MACS or min(m, k, n) < 64:
        return None
    pads = [-d % align for d in (m, k, n)]
    return _MatmulSizes(m, n, *pads) if any(pads) else None


class _MatmulPadder:
    """Rewrites the misaligned matmuls of one graph onto padded operands, padding each operand once for
    every matmul that reads it."""

    def __init__(self, graph: torch.fx.Graph, inference: bool):
        self.graph, self.inference = graph, inference
        self.padded: dict = {}          # (node, rows, cols) -> its padded form
        self.unpadded: dict = {}        # a padded form sliced back -> the node it was padded from
        self.pads: set = set()          # the pad nodes made here (no reader to redirect)

    def rewrite(self, node: torch.fx.Node, s: _MatmulSizes) -> None:
        """Replace the matmul `node` by its product on padded operands, sliced back to its sizes."""
        a, b = node.args[-2], node.args[-1]
        bias = node.args[0] if node.target is aten.addmm.default else None
        large = _large_input(a) if config.chunked_input_pads and (s.pad_m or s.pad_k) and not s.pad_n else None
        a2 = None if large else self.pad(a, s.pad_m, s.pad_k, node)
        b2 = self.pad(b, s.pad_k, s.pad_n, node)
        with self.graph.inserting_before(node):
            bias2 = call_op(self.graph, aten.constant_pad_nd.default, bias, [0, s.pad_n]) \
                if bias is not None and s.pad_n else bias
            if large:
                out = call_op(self.graph, chunk_padded_mm, *large, b2, bias2, s.pad_m, s.pad_k)
                val = large[0].meta["val"]
                _copies_ahead(val, chunk_padded_mm_copies(val, large[1], s.pad_m, s.pad_k))
                out, restrided = _slice_back(self.graph, out, (s.m, s.n), s.pad_m, 0), None
            else:
                out, restrided = self._product(node, a2, b2, bias2, s)
        if restrided is None:
            # the result keeps the matmul's traced value (eager's dense strides): where it is returned,
            # directly or through views, the lowering's output check copies it into them
            out.meta["val"] = node.meta["val"]
        else:
            # an inference graph returns the padded product's views with the padded strides
            for view, val in restrided.items():
                view.meta["val"] = val
        node.replace_all_uses_with(out)
        self.graph.erase_node(node)

    def rewrite_pairs(self, found: list) -> set:
        """With config.chunked_input_pads: where one large input G (see `_large_input`) is read by exactly
        two misaligned products, as G @ b and as G.t() @ bt (a backward's logits gradient: the input and
        the weight gradient of an LM head), both become one ember::chunk_padded_mm_pair, which copies each
        column chunk of G into its aligned buffer once for both. Returns the matmuls rewritten."""
        by_input: dict = {}
        for n, s in found:
            large = _large_input(n.args[0]) if n.target is aten.mm.default and not s.pad_n else None
            if large is not None:
                by_input.setdefault(large[0], []).append((n, s, large[1]))
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        done = set()
        for g, uses in by_input.items():
            if sorted(transposed for _, _, transposed in uses) != [False, True]:
                continue
            (plain, ps, _), (trans, ts, _) = sorted(uses, key=lambda u: u[2])
            first = min(plain, trans, key=order.__getitem__)
            b, bt = plain.args[1], trans.args[1]
            if (ps.pad_m, ps.pad_k) != (ts.pad_k, ts.pad_m) or \
                    any(order.get(x, -1) > order[first] for x in (b, bt)):
                continue
            b2, bt2 = self.pad(b, ps.pad_k, 0, first), self.pad(bt, ts.pad_k, 0, first)
            with self.graph.inserting_before(first):
                pair = call_op(self.graph, chunk_padded_mm_pair, g, b2, bt2, ps.pad_m, ps.pad_k)
                for i, (node, s) in enumerate(((plain, ps), (trans, ts))):
                    got = self.graph.call_function(operator.getitem, (pair, i))
                    got.meta["val"] = pair.meta["val"][i]
                    out = _slice_back(self.graph, got, (s.m, s.n), s.pad_m, 0)
                    out.meta["val"] = node.meta["val"]
                    node.replace_all_uses_with(out)
                    self.graph.erase_node(node)
                    done.add(node)
            _copies_ahead(g.meta["val"], chunk_padded_mm_pair_copies(g.meta["val"], ps.pad_m, ps.pad_k))
        return done

    def _product(self, node, a2, b2, bias2, s: _MatmulSizes) -> tuple:
        """(node's result from the padded operands, {view of it: its traced value} or None). Sliced back
        from the padded product, except where a forward or backward graph returns a result padded along
        N: ember::padded_mm then computes it dense. An inference graph returns the sliced product's views
        with the padded strides where views can be taken of it."""
        returned = bool(s.pad_n) and _returned(node)
        out = restrided = None
        if not returned or self.inference:
            out = call_op(self.graph, aten.addmm.default, bias2, a2, b2, **node.kwargs) if bias2 is not None \
                else call_op(self.graph, aten.mm.default, a2, b2)
            out = _slice_back(self.graph, out, (s.m, s.n), s.pad_m, s.pad_n)
            if returned:
                restrided = _views_restrided(node, out.meta["val"])
        if returned and restrided is None:
            out = call_op(self.graph, padded_mm, a2, b2, bias2, s.m, s.n)
            # its chunks are copied from the padded product's rows into the dense result's
            val = node.meta["val"]
            backend_for(val.device).runtime_row_copy_ahead(val.dtype, s.n, s.n + s.pad_n, s.n)
        return out, restrided

    def pad(self, x, rows: int, cols: int, matmul: torch.fx.Node):
        """x (2-D) with `rows` and `cols` zeros added, for `matmul`. A transposed operand is padded in its
        base's order and transposed back: a plain copy, not a transposing one, and one padded tensor serves
        every matmul that reads the base either way (GPT-2's logits gradient feeds the input gradient as
        is and the weight gradient transposed)."""
        if not (rows or cols):
            return x
        x = self.unpadded.get(x, x)
        base = _transposed_base(x)
        if base is not None:
            padded_base = self.pad(base, cols, rows, matmul)
            with self.graph.inserting_before(matmul):
                return call_op(self.graph, aten.permute.default, padded_base, [1, 0])
        if (x, rows, cols) in self.padded:
            return self.padded[x, rows, cols]
        computed = x.op == "call_function"
        with self.graph.inserting_before(x.next if computed else matmul):  # (inserting_after(x) would reverse a chain)
            p = self.padded[x, rows, cols] = call_op(self.graph, aten.constant_pad_nd.default, x, [0, cols, 0, rows])
        self.pads.add(p)
        if computed:
            self._read_sliced_back(x, p, rows, cols)
        return p

    def _read_sliced_back(self, x: torch.fx.Node, padded: torch.fx.Node, rows: int, cols: int) -> None:
        """x's other readers read its padded form sliced back, so x's producer writes the padded form and
        the unpadded one is never stored."""
        readers = [u for u in x.users if u.op != "output" and u not in self.pads]
        if not readers:
            return
        with self.graph.inserting_before(padded.next):
            back = _slice_back(self.graph, padded, x.meta["val"].shape, rows, cols)
        self.unpadded[back] = x
        for u in readers:
            u.replace_input_with(x, back)


def _large_input(x):
    """(m, transposed) where x is m (False) or m transposed (True) and m is an input of the graph, or a
    reshape of one (a backward's [batch, seq, vocab] gradient read as [tokens, vocab]), of
    PAD_INPUT_WHOLE_MAX_BYTES or more; else None."""
    base = _transposed_base(x)
    m, transposed = (base, True) if base is not None else (x, False)
    root = m
    while root.op == "call_function" and root.target in RESHAPES:
        root = root.args[0]
    v = _val(m)
    if root.op != "placeholder" or v is None or v.numel() * v.element_size() < PAD_INPUT_WHOLE_MAX_BYTES:
        return None
    return m, transposed


def _copies_ahead(val, copies: set) -> None:
    """Have the backend build ahead the row copies a chunked product will launch on `val`'s device."""
    backend = backend_for(val.device)
    for n, src_stride, dst_stride in copies:
        backend.runtime_row_copy_ahead(val.dtype, n, src_stride, dst_stride)


def _views_restrided(node, val):
    """{view: its traced value} for every view read from node (and from those views) when node's value is
    `val` (a padded product sliced back: the padded row stride), or None where a view cannot be taken of
    it (a reshape that would have to copy)."""
    vals = {}

    def walk(n, v):
        for u in n.users:
            if u.op == "call_function" and u.target in VIEW_OPS:
                args = [v if a is n else (a.meta["val"] if isinstance(a, torch.fx.Node) else a) for a in u.args]
                try:
                    with v.fake_mode:
                        out = u.target(*args, **u.kwargs)
                except Exception:        # a view that would have to copy (fake tensors raise their own types)
                    return False
                vals[u] = out
                if not walk(u, out):
                    return False
        return True
    return vals if walk(node, val) else None


def _slice_back(graph: torch.fx.Graph, x, shape, rows: int, cols: int):
    """x, padded by `rows` and `cols`, sliced back to `shape`."""
    if rows:
        x = call_op(graph, aten.slice.Tensor, x, 0, 0, shape[0])
    if cols:
        x = call_op(graph, aten.slice.Tensor, x, 1, 0, shape[1])
    return x


def _returned(node) -> bool:
    """Does the graph return node, or a view of it?"""
    return any(u.op == "output" or (u.op == "call_function" and u.target in VIEW_OPS and _returned(u))
               for u in node.users)


def _transposed_base(x):
    """y where the 2-D node x is y transposed, else None."""
    if not isinstance(x, torch.fx.Node) or x.op != "call_function":
        return None
    if x.target is aten.t.default or (x.target is aten.permute.default and list(x.args[1]) == [1, 0]) or \
            (x.target is aten.transpose.int and sorted(d % 2 for d in x.args[1:3]) == [0, 1]):
        base = x.args[0]
        v = base.meta.get("val") if isinstance(base, torch.fx.Node) else None
        return base if isinstance(v, torch.Tensor) and v.dim() == 2 else None
    return None


def _val(x):
    """x's fake value, where x is a node that has one."""
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


# attention first: it reads the softmax that online_softmax_stats rewrites; a bias and activation the GEMM
# library fuses before unfuse_bias_addmm moves the bias into a kernel
PASSES: list = [fuse_attention_inference, remove_noop_casts, restore_multiply_adds, scatter_into_constant,
                online_softmax_stats, fuse_bias_activations, unfuse_bias_addmm, unfuse_convolution_bias,
                pad_matmuls, plan_conv_layouts, bucket_collectives, reinplace_all_reduces, dead_code_elimination]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.post_grad_passes)
