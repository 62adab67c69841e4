"""Passes on the functional ATen graph that compile_graph lowers (forward, backward or inference)."""
from __future__ import annotations

import operator

import torch
import torch.fx

from ... import config
from ...device import backend_for
from .common import VIEW_OPS, dead_code_elimination, run_passes

aten = torch.ops.aten
# gm.meta[GRAPH_KIND]: "forward", "backward" or "inference", set by compile_graph before the passes run
GRAPH_KIND = "ember_graph_kind"


def remove_noop_ops(gm: torch.fx.GraphModule) -> None:
    """Drop casts to the dtype a value already has."""
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is torch.ops.prims.convert_element_type.default and _dtype(n.args[0]) == n.args[1]:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


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
    [tokens, vocabulary] float32 zeros tensor this way."""
    from ..pattern import _fill_meta
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.scatter.value or n.kwargs:
            continue
        base, dim, index, value = n.args
        fill, out = _constant_fill(base), n.meta.get("val")
        idx = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if fill is None or out is None or idx is None or idx.dim() != out.dim() or out.dim() == 0:
            continue
        dim = dim % out.dim()
        if idx.shape[dim] != 1 or any(idx.shape[d] != out.shape[d] for d in range(out.dim()) if d != dim):
            continue
        shape = [1] * out.dim()
        shape[dim] = out.shape[dim]
        g = gm.graph
        with g.inserting_before(n):
            iota = g.call_function(aten.arange.start_step, (0, out.shape[dim], 1),
                                   {"dtype": idx.dtype, "device": out.device})
            hit = g.call_function(aten.eq.Tensor, (g.call_function(aten.view.default, (iota, shape)), index))
            scalars = [g.call_function(aten.full.default, ([], x), {"dtype": out.dtype, "device": out.device})
                       for x in (value, fill)]
            where = g.call_function(aten.where.self, (hit, *scalars))
        new = [iota, hit.args[0], hit, *scalars, where]
        n.replace_all_uses_with(where)
        g.erase_node(n)
        _fill_meta(gm, new)


def _one_dim(dims, ndim):
    """The single dim of a reduction's dims argument, non-negative; None for several or all dims."""
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return dims[0] % ndim if len(dims) == 1 and ndim else None


def _reduces_like(node, target, x, dim) -> bool:
    """node is target(x, [dim], keepdim=True) with no dtype argument."""
    if node.op != "call_function" or node.target is not target or node.kwargs.get("dtype") is not None:
        return False
    args = list(node.args) + [None] * 3
    keepdim = node.kwargs.get("keepdim", args[2])
    return args[0] is x and keepdim is True and _one_dim(args[1], x.meta["val"].dim()) == dim


def online_softmax_stats(gm: torch.fx.GraphModule) -> None:
    """`m = amax(x, d, keepdim)` and `sum(exp(x - m), d, keepdim)`, the row statistics of softmax,
    log-softmax and cross-entropy, become one `ember::softmax_stats(x, d)`: one reduction carrying the
    running max and the sum of exp rescaled to it, so a row too long to hold in registers is read once,
    not once for the max and again for the sum, where the kernel backend wants that
    (KernelBackend.reads_rows_online). Float32/64 rows only (narrow floats are upcast first by the
    decompositions, and the statistics' dtype must be x's)."""
    from ..custom_ops import softmax_stats
    g = gm.graph
    for m in list(g.nodes):
        if m.op != "call_function" or m.target is not aten.amax.default or not m.args:
            continue
        x = m.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if val is None or val.dtype not in (torch.float32, torch.float64) or val.dim() == 0 or \
                not backend_for(val.device).reads_rows_online:
            continue
        dim = _one_dim(m.args[1] if len(m.args) > 1 else m.kwargs.get("dim"), val.dim())
        if dim is None or not _reduces_like(m, aten.amax.default, x, dim):
            continue
        total = next((s for sub in m.users if sub.target is aten.sub.Tensor and sub.args == (x, m)
                      for e in sub.users if e.target is aten.exp.default
                      for s in e.users if _reduces_like(s, aten.sum.dim_IntList, e, dim)), None)
        if total is None:
            continue
        with g.inserting_before(m):
            stats = g.call_function(softmax_stats, (x, dim))
            new_m = g.call_function(operator.getitem, (stats, 0))
            new_total = g.call_function(operator.getitem, (stats, 1))
        stats.meta["val"] = (m.meta["val"], total.meta["val"])
        new_m.meta["val"], new_total.meta["val"] = m.meta["val"], total.meta["val"]
        m.replace_all_uses_with(new_m)
        total.replace_all_uses_with(new_total)
        g.erase_node(total)
        g.erase_node(m)


_VIEWS_OF_ROWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _feeds_pointwise_only(node) -> bool:
    """Do all of node's readers (through reshapes) compute elementwise (ATen's pointwise tag)?"""
    for u in node.users:
        if u.op != "call_function":
            return False
        if u.target in _VIEWS_OF_ROWS:
            if not _feeds_pointwise_only(u):
                return False
        elif not (isinstance(u.target, torch._ops.OpOverload) and torch.Tag.pointwise in u.target.tags):
            return False
    return bool(node.users)


def unfuse_bias_addmm(gm: torch.fx.GraphModule) -> None:
    """`addmm(bias, a, b)` whose result only feeds pointwise ops is `mm(a, b) + bias`: the add (and
    autocast's cast of the bias) then runs in the kernel of those ops, which reads the product anyway,
    instead of as a separate cast kernel before the GEMM (KernelBackend.adds_matmul_bias_in_epilogue).
    A 16-bit product is then rounded before the bias is added, as inductor's does."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "call_function" or n.target is not aten.addmm.default or n.kwargs:
            continue
        bias, a, b = n.args
        val, bval = n.meta.get("val"), bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if val is None or bval is None or bval.dim() != 1 or bval.dtype != val.dtype or \
                not backend_for(val.device).adds_matmul_bias_in_epilogue or not _feeds_pointwise_only(n):
            continue
        with g.inserting_before(n):
            mm = g.call_function(aten.mm.default, (a, b))
            out = g.call_function(aten.add.Tensor, (mm, bias))
        with val.fake_mode:
            mm.meta["val"] = torch.mm(a.meta["val"], b.meta["val"])
        out.meta["val"] = val
        n.replace_all_uses_with(out)
        g.erase_node(n)


# A matmul below this many multiply-adds keeps its sizes: the padded copies would cost about what the
# misaligned GEMM loses
PAD_MATMUL_MIN_MACS = 2 ** 31
# 16-bit floats only: a padded float32 GEMM on an H200 (torch 2.11, cuBLAS of CUDA 13) came out with a
# relative error of ~5e-4, TF32's size, where the unpadded one had float32's (tests/test_passes.py on the
# GPU): a cuBLAS choice we do not control, so float32 keeps its sizes
_PADDED_MATMUL_DTYPES = (torch.bfloat16, torch.float16)


def pad_matmuls(gm: torch.fx.GraphModule) -> None:
    """A large mm/addmm whose M, K or N is not a multiple of the device's matmul alignment
    (KernelBackend.matmul_alignment) runs on zero-padded operands and its result is sliced back:
    zeros added along K add nothing, rows or columns added along M or N are sliced off. On an H200,
    GPT-2's LM head (N = 50257) went from 3.3 ms to the aligned GEMM's ~0.45 ms plus the copies.

    The pads are ember's pointwise kernels. An operand computed in the graph is padded where it is
    computed, and its other readers read the padded tensor sliced back: its producer then writes the
    padded form directly and the unpadded one is never stored (GPT-2's and BERT's logits gradient feeds
    both gradient matmuls and the bias gradient). An input (a weight) is padded right before the matmul.
    A result padded along N that a forward graph returns must come out dense (the backward reads saved
    outputs by eager's strides): `ember::padded_mm` computes it in row chunks, so no whole padded product
    sits beside the dense copy. An inference graph returns the padded product's view as it is, with the
    padded row stride, as inductor does: no copy, no chunks (GPT-2's logits: 2.6 ms per step where the
    row chunks took 4.1-5.3 back to back, scripts/host_profile.py)."""
    from ..custom_ops import padded_mm
    g = gm.graph
    inference = gm.meta.get(GRAPH_KIND) == "inference"
    padded = {}           # (node, rows, cols) -> its padded form
    unpadded = {}         # a padded form sliced back -> the node it was padded from
    pads = set()          # the pad nodes made here (no reader to redirect)

    def call(op, *args, **kwargs):
        node = g.call_function(op, args, kwargs)
        fake = next(x.meta["val"] for x in args if isinstance(x, torch.fx.Node))
        with fake.fake_mode:
            node.meta["val"] = op(*[x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args], **kwargs)
        return node

    def pad(x, rows, cols):
        """x (2-D) with `rows` and `cols` zeros added. A transposed operand is padded in its base's order
        and transposed back: a plain copy, not a transposing one, and one padded tensor serves every
        matmul that reads the base either way (GPT-2's logits gradient feeds the input gradient as is
        and the weight gradient transposed)."""
        if not (rows or cols):
            return x
        x = unpadded.get(x, x)
        base = _transposed_base(x)
        if base is not None:
            padded_base = pad(base, cols, rows)
            with g.inserting_before(n):
                return call(aten.permute.default, padded_base, [1, 0])
        if (x, rows, cols) in padded:
            return padded[x, rows, cols]
        computed = x.op == "call_function"
        with g.inserting_before(x.next if computed else n):     # (inserting_after(x) would reverse a chain)
            p = padded[x, rows, cols] = call(aten.constant_pad_nd.default, x, [0, cols, 0, rows])
        pads.add(p)
        if computed:
            readers = [u for u in x.users if u.op != "output" and u not in pads]
            if readers:
                with g.inserting_before(p.next):
                    back = _slice_back(call, p, x.meta["val"].shape, rows, cols)
                unpadded[back] = x
                for u in readers:
                    u.replace_input_with(x, back)
        return p

    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in (aten.mm.default, aten.addmm.default):
            continue
        a, b = n.args[-2], n.args[-1]
        bias = n.args[0] if n.target is aten.addmm.default else None
        va, vb = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b))
        if va is None or vb is None or not all(isinstance(d, int) for d in (*va.shape, *vb.shape)):
            continue
        if va.dtype not in _PADDED_MATMUL_DTYPES:
            continue
        if bias is not None and (not isinstance(bias, torch.fx.Node) or bias.meta["val"].dim() != 1):
            continue
        align = backend_for(va.device).matmul_alignment // va.element_size()
        (M, K), N = va.shape, vb.shape[1]
        if align <= 1 or M * K * N < PAD_MATMUL_MIN_MACS or min(M, K, N) < 64:
            continue
        pm, pk, pn = (-d % align for d in (M, K, N))
        if not (pm or pk or pn):
            continue
        a2, b2 = pad(a, pm, pk), pad(b, pk, pn)
        returned = bool(pn) and _returned(n)
        with g.inserting_before(n):
            bias2 = call(aten.constant_pad_nd.default, bias, [0, pn]) if bias is not None and pn else bias
            out = None
            if not returned or inference:
                out = call(aten.addmm.default, bias2, a2, b2, **n.kwargs) if bias is not None else \
                    call(aten.mm.default, a2, b2)
                out = _slice_back(call, out, (M, N), pm, pn)
            restrided = _views_restrided(n, out.meta["val"]) if returned and out is not None else None
            if returned and restrided is None:
                out = call(padded_mm, a2, b2, bias2, M, N)
        if restrided is None:
            # the result keeps the matmul's traced value (eager's dense strides): where it is returned,
            # directly or through views, the lowering's output check copies it into them
            out.meta["val"] = n.meta["val"]
        else:
            # an inference graph returns the padded product's views with the padded strides
            for view, val in restrided.items():
                view.meta["val"] = val
        n.replace_all_uses_with(out)
        g.erase_node(n)


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


def _slice_back(call, x, shape, rows, cols):
    """x, padded by `rows` and `cols`, sliced back to `shape`."""
    if rows:
        x = call(aten.slice.Tensor, x, 0, 0, shape[0])
    if cols:
        x = call(aten.slice.Tensor, x, 1, 0, shape[1])
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


def _dtype(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(v, "dtype", None)


PASSES: list = [remove_noop_ops, scatter_into_constant, online_softmax_stats, unfuse_bias_addmm, pad_matmuls,
                dead_code_elimination]


def run(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return run_passes(gm, PASSES, config.post_grad_passes)
