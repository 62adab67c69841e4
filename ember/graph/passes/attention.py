"""Hand-written attention -> the fused scaled-dot-product attention kernel.

    softmax(q @ k^T * scale [+ mask]) [dropout] @ v

reaches ember's graphs as two batched matmuls around a decomposed softmax: each 4-D matmul is flattened to
a bmm over batch x heads. This pass puts ATen's scaled_dot_product_attention there instead, traced for the
matched values, so the graph holds the fused kernel eager's SDPA would pick for them (flash attention for
the CPU; flash, memory-efficient or cuDNN on a GPU) and, in the joint graph, its backward kernel, each run
as one ATen call (graph/decompose.py keeps them whole: FUSED_ATTENTION).

The fixed part, `softmax(x) [cast] [clone | dropout] @ v` (and in the joint graph its backward), is found by
Patterns (graph/pattern.py), traced with ember's decompositions. The variable part is read in code from
the softmax's input up to `view(bmm(q, k^T))`: any sequence of scalar scales (mul, div), additive masks,
masked fills (where) and casts, in any order, such as BERT's `scores / sqrt(d) + mask`, GPT-2's
`where(causal, scores / sqrt(d), min) + mask` or Llama's `softmax(scores * s + mask, dtype=float32)`.

A match is rewritten only where the fused kernel gives the hand-written result within its tolerance:
  - every scale is a positive number (a negative one would turn a masked -inf into +inf), not a graph
    value (one computed from a symbolic size);
  - a fill of -inf becomes a boolean mask (the same softmax, except in a row whose every key is masked,
    where the hand-written softmax gives NaN); a finite fill is added as `where(cond, fill, 0)` only when
    it is at most -1e30 (float32's and bfloat16's `finfo.min`, as HF models use): adding any score of a
    sane size to it rounds back to it, so a masked score and a row of them come out the same as eager's;
    smaller fills (-1e4, -1e9) are left alone;
  - a boolean mask that is a constant lower triangle (`tril(ones(L, S))`) becomes `is_causal=True`;
  - masks are combined into one: boolean where every mask keeps or drops whole scores, else additive, in
    the query's dtype as SDPA takes it (under autocast, a float32 mask is rounded to 16 bits, as when eager
    calls SDPA under autocast); a 16-bit additive mask holds -inf at the dtype's lowest finite value;
  - k and v repeated for grouped-query attention (`repeat_interleave` or `expand` + `reshape`) are passed
    unrepeated with `enable_gqa=True` in inference graphs, where the fused kernel takes that;
  - dropout (joint graph only) becomes SDPA's dropout_p: the kept entries are random either way, and
    neither eager's nor ember's random stream is the fused kernel's;
  - tracing SDPA on the matched values picks a fused kernel, not its math decomposition (the CPU has no
    fused kernel with dropout, a key dim other than the value dim falls back to math ...).
`ember.metrics.attention_rewrites` counts the rewrites.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ... import config, metrics
from ..decompose import FUSED_ATTENTION, decomposition_table
from ..pattern import Pattern

aten = torch.ops.aten

# A finite masked fill at most this is added as a mask: any score of a sane size added to it rounds back to it
_HUGE_FILL = -1e30
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)

# -- the fixed tail: softmax(x) [cast] [clone | dropout] @ v ------------------------------------------------

# distinct sizes, so that tracing bakes no size in twice by chance (literals are checked in code anyway)
_B, _H, _L, _S, _DV = 2, 3, 5, 7, 11


def _tail(cast: bool, after: str):
    def tail(x, v3):
        p = torch.softmax(x, -1)
        if cast:
            p = p.to(torch.bfloat16)
        if after == "clone":
            p = p.clone()
        elif after == "dropout":
            p = F.dropout(p, 0.25, True)
        return torch.bmm(p.expand(_B, _H, _L, _S).reshape(_B * _H, _L, _S), v3)
    tail.__name__ = f"attention_tail{'_cast' if cast else ''}{'_' + after if after else ''}"
    return tail


def _tail_examples(x_dtype, v_dtype) -> list:
    return [torch.randn(_B, _H, _L, _S, dtype=x_dtype), torch.randn(_B * _H, _S, _DV, dtype=v_dtype)]


def _tail_patterns(trace: str, variants) -> list:
    return [Pattern(_tail(cast, after), None, _tail_examples(x_dtype, v_dtype), trace=trace, ignore_literals=True,
                    extra_check=_tail_checks) for cast, after, x_dtype, v_dtype in variants]


def _tail_checks(match) -> bool:
    """The literals the patterns ignore say softmax over the last dim, views that only merge or split batch
    and heads, casts between floating dtypes on one device, dropout in training."""
    x, v3 = _val(match["x"]), _val(match["v3"])
    if not (_is_float(x) and _is_float(v3) and x.dim() == 4 and v3.dim() == 3):
        return False
    dropout = [n for n in match.nodes.values() if n.target is aten.native_dropout.default]
    # the one scalar factor of the joint tails: dropout's backward scales the kept entries by 1 / (1 - p)
    factor = 1 / (1 - dropout[0].args[1]) if dropout and dropout[0].args[1] < 1 else None
    return all(_literals_fit(n, factor) for n in match.nodes.values())


def _literals_fit(n: torch.fx.Node, factor: Optional[float]) -> bool:
    t, out = n.target, _val(n)
    if n.kwargs.get("alpha", 1) != 1 or n.kwargs.get("dtype") is not None and t is not aten._to_copy.default:
        return False
    if t is aten.mul.Tensor and _number(n.args[1]) is not None:
        return factor is not None and math.isclose(n.args[1], factor, rel_tol=1e-6)
    if t in (aten.amax.default, aten.sum.dim_IntList):
        dims = list(n.args[1])
        return len(dims) == 1 and dims[0] in (-1, out.dim() - 1) and n.args[2] is True
    if t is aten.expand.default:
        return _same_shape(_val(n.args[0]), out)
    if t in _VIEWS:
        return _heads_merged(_val(n.args[0]), out) or _heads_merged(out, _val(n.args[0]))
    if t is aten.permute.default:
        return list(n.args[1]) == [0, 2, 1]
    if t in _CASTS:
        return _is_float(out) and out.device == _val(n.args[0]).device
    if t is aten.native_dropout.default:
        return n.args[2] is True and 0 < n.args[1] < 1
    return True


_F32, _BF16 = torch.float32, torch.bfloat16
# inference graphs: a float32 softmax, or one cast down for the matmul (autocast; a 16-bit softmax's own
# upcast is then a cast in the scores chain); `clone` is dropout in eval mode
INFERENCE_TAILS = _tail_patterns("aten", [(False, "", _F32, _F32), (True, "", _F32, _BF16),
                                          (False, "clone", _F32, _F32), (True, "clone", _F32, _BF16)])
# the joint graph: the backward of a 16-bit softmax differs from that of a cast and a float32 softmax
JOINT_TAILS = _tail_patterns("joint", [(cast, after, x_dtype, v_dtype) for after in ("", "dropout", "clone")
                                       for cast, x_dtype, v_dtype in [(False, _F32, _F32), (True, _F32, _BF16),
                                                                      (False, _BF16, _BF16)]])


# -- the scores: view(bmm(q, k^T)) then scales, masks and casts ---------------------------------------------

@dataclasses.dataclass
class _Scores:
    """What the softmax's input is: `scale * (q @ k^T)` plus masks."""
    head: torch.fx.Node                              # view(bmm(q3, kt3), [B, H, L, S])
    chain: list                                      # the nodes from head to the softmax's input
    scale: float = 1.0
    added: list = dataclasses.field(default_factory=list)     # (mask node, factor): factor * mask is added
    fills: list = dataclasses.field(default_factory=list)     # (cond, negated, fill): fill where cond is True
    keeps: list = dataclasses.field(default_factory=list)     # (cond, negated): -inf where cond is False


def _read_scores(x: torch.fx.Node) -> Optional[_Scores]:
    """x as `scale * (q @ k^T)` plus masks, or None where it is something else."""
    ops = []
    cur = x
    # x's readers are the softmax's; every node before it feeds only the next
    while not _is_scores_head(cur):
        if cur.op != "call_function" or (cur is not x and len(cur.users) != 1) or \
                not _same_shape(_val(cur), _val(x)):
            return None
        prev = _score_operand(cur)
        if prev is None:
            return None
        ops.append(cur)
        cur = prev
    if cur is not x and len(cur.users) != 1:
        return None
    scores = _Scores(cur, list(reversed(ops)))
    for op in scores.chain:
        if not _apply(scores, op):
            return None
    return scores


def _is_scores_head(n) -> bool:
    if n.op != "call_function" or n.target not in _VIEWS:
        return False
    bmm = n.args[0]
    return isinstance(bmm, torch.fx.Node) and bmm.target is aten.bmm.default and len(bmm.users) == 1 and \
        _heads_merged(_val(n), _val(bmm))


def _score_operand(n) -> Optional[torch.fx.Node]:
    """The input of n that carries the scores (the others are masks or constants)."""
    t, args = n.target, n.args
    if t in _CASTS or (t in (aten.mul.Tensor, aten.div.Tensor) and _number(args[1]) is not None):
        return args[0]
    if t is aten.add.Tensor and not n.kwargs:
        # the operand the scores flow through: the one that reaches view(bmm(q, k^T)) where both could
        shaped = [a for a in args if isinstance(a, torch.fx.Node) and _same_shape(_val(a), _val(n))]
        return next((a for a in shaped if _reaches_scores_head(a)), shaped[0] if shaped else None)
    if t is aten.where.self:
        return args[2] if _fill_value(args[1]) is not None else args[1]
    return None


def _reaches_scores_head(n, steps: int = 16) -> bool:
    while steps and isinstance(n, torch.fx.Node) and not _is_scores_head(n):
        n, steps = (_score_operand(n) if n.op == "call_function" else None), steps - 1
    return isinstance(n, torch.fx.Node) and _is_scores_head(n)


def _apply(s: _Scores, n: torch.fx.Node) -> bool:
    """Fold op n (applied to the scores so far) into s; False where the fused kernel can't express it."""
    t, args = n.target, n.args
    if t in _CASTS:
        return True
    if t in (aten.mul.Tensor, aten.div.Tensor):
        c = _number(args[1])
        if c is None or not math.isfinite(c) or c <= 0:
            return False
        c = c if t is aten.mul.Tensor else 1.0 / c
        s.scale *= c
        s.added = [(m, f * c) for m, f in s.added]
        s.fills = [(cond, neg, fill * c) for cond, neg, fill in s.fills]
        return True
    if t is aten.add.Tensor:
        other = args[1] if _score_operand(n) is args[0] else args[0]
        if _number(other) is not None:
            return True             # a constant added to every score leaves the softmax as it is
        if not isinstance(other, torch.fx.Node) or not _is_float(_val(other)):
            return False
        s.added.append((other, 1.0))
        return True
    # where(cond, fill, scores): fill where cond; where(cond, scores, fill): fill where not cond
    fill_first = _fill_value(args[1]) is not None
    fill = _fill_value(args[1] if fill_first else args[2])
    cond, negated = _plain_condition(args[0], negated=not fill_first)
    if fill is None or _val(cond) is None or _val(cond).dtype != torch.bool:
        return False
    if fill == -math.inf:
        s.keeps.append((cond, not negated))
        return True
    if fill > _HUGE_FILL:
        return False
    s.fills.append((cond, negated, fill))
    return True


def _plain_condition(cond, negated: bool):
    """(c, negated) with `cond == (not c if negated else c)`, looking through logical negations."""
    while isinstance(cond, torch.fx.Node) and cond.target in (aten.bitwise_not.default, aten.logical_not.default) \
            and _val(cond.args[0]) is not None and _val(cond.args[0]).dtype == torch.bool:
        cond, negated = cond.args[0], not negated
    return cond, negated


def _fill_value(x) -> Optional[float]:
    """The number a where's branch holds, when it is a scalar (a literal, scalar_tensor or a 0-d full)."""
    if isinstance(x, torch.fx.Node) and x.op == "call_function":
        if x.target is aten.scalar_tensor.default:
            return _number(x.args[0])
        if x.target is aten.full.default and list(x.args[0]) == []:
            return _number(x.args[1])
        return None
    return _number(x)


def _number(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


# -- q, k and v as 4-D values ------------------------------------------------------------------------------

def _unflattened(n3: torch.fx.Node, shape4) -> Optional[torch.fx.Node]:
    """The 4-D value of shape4 that the bmm operand n3 ([B*H, a, b]) flattens, where n3 is
    `view([clone](expand(y)))` with an expand that adds nothing (the form a 4-D matmul takes)."""
    y = n3.args[0] if n3.op == "call_function" and n3.target in _VIEWS else None
    if y is not None and y.op == "call_function" and y.target is aten.clone.default:
        y = y.args[0]
    if y is not None and y.op == "call_function" and y.target is aten.expand.default:
        y = y.args[0]
    return y if isinstance(y, torch.fx.Node) and _same_shape(_val(y), shape4) else None


def _untransposed(kt4: torch.fx.Node) -> Optional[torch.fx.Node]:
    """k where kt4 is k with its last two dims swapped."""
    if kt4.op == "call_function" and kt4.target is aten.permute.default and list(kt4.args[1]) == [0, 1, 3, 2]:
        return kt4.args[0]
    return None


def _grouped(k4: torch.fx.Node):
    """(k, n) where k4 repeats each of k's heads n times (repeat_interleave, or expand + reshape), else None."""
    y = k4.args[0] if k4.op == "call_function" and k4.target in _VIEWS else None
    if y is None or y.target is not aten.clone.default:
        return None
    e = y.args[0]
    if e.op != "call_function" or e.target is not aten.expand.default:
        return None
    u = e.args[0]
    if u.op != "call_function" or u.target is not aten.unsqueeze.default or u.args[1] != 2:
        return None
    k, rep = u.args[0], _val(e).shape[2]
    kv, k4v = _val(k), _val(k4)
    if kv.dim() != 4 or not isinstance(rep, int) or not _same_shape(kv.shape[2:], k4v.shape[2:]) or \
            not statically_known_true(kv.shape[1] * rep == k4v.shape[1]):
        return None
    return k, rep


# -- one rewrite --------------------------------------------------------------------------------------------

def fuse_attention_inference(gm: torch.fx.GraphModule) -> None:
    """Post-grad pass: rewrite each hand-written attention of an inference (or forward) graph."""
    _fuse(gm, INFERENCE_TAILS, joint=False)


def fuse_attention_joint(gm: torch.fx.GraphModule) -> None:
    """Joint-graph pass: rewrite each hand-written attention with its backward, so the partitioner saves
    what SDPA's backward kernel reads; then the forward-only form, for attention no gradient flows into."""
    _fuse(gm, JOINT_TAILS, joint=True)
    _fuse(gm, INFERENCE_TAILS, joint=False)


def _fuse(gm: torch.fx.GraphModule, tails: list, joint: bool) -> None:
    if not _may_hold_attention(gm):
        return
    made = 0
    for pattern in tails:
        for m in pattern.matches(gm):
            if any(getattr(n, "_erased", False) for n in m.nodes.values()):
                continue
            rewrite = _prepared(m, joint)
            if rewrite is not None:
                rewrite(gm)
                made += 1
    if made:
        metrics.attention_rewrites += made
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()


def _may_hold_attention(gm) -> bool:
    """Two bmms and a max reduction: the cheap test before any pattern is traced or matched."""
    bmms = amax = 0
    for n in gm.graph.nodes:
        bmms += n.target is aten.bmm.default
        amax += n.target is aten.amax.default
    return bmms >= 2 and amax >= 1


def _prepared(m, joint: bool):
    """The rewrite of match m, a function of the graph module, or None where m is not an attention the
    fused kernel computes the same. Reading the match changes nothing in the graph: a failure there leaves
    the graph as it was and the match alone (raised where ember is told not to fall back)."""
    try:
        scores = _read_scores(m["x"])
        grads = _score_grads(m.outputs[1], scores) if joint and scores is not None else None
        if scores is None or (joint and grads is None):
            return None
        dropout = [n for n in m.nodes.values() if n.target is aten.native_dropout.default]
        plan = _Plan.of(scores, m["v3"], dropout[0].args[1] if dropout else 0.0,
                        m["tangent_0"] if joint else None)
        traced = plan.trace(gqa=plan.gqa is not None) if plan is not None else None
        if traced is None and plan is not None and plan.gqa is not None:
            traced = plan.trace(gqa=False)
    except Exception:
        if not config.fallback_on_error:
            raise
        return None
    if traced is None:
        return None

    def rewrite(gm):
        old_out = m.outputs[0]
        matched = set(m.nodes.values())
        bwd_anchor = min((u for u in m["tangent_0"].users if u in matched), key=_position(gm)) if joint else None
        new = _splice(gm, traced, plan.inputs(), old_out, bwd_anchor)
        _rewire(gm, old_out, new["out"], new["out3"])
        if joint:
            dq3, dkt3, chain = grads
            _rewire(gm, m.outputs[2], new["dv"], new["dv3"])
            for old, name in ((dq3, "dq"), (dkt3, "dkt")):
                if old is not None:
                    _rewire(gm, old, new[name], new[name + "3"])
            matched.update(chain)
        _erase_dead(gm, matched | set(scores.chain) | {scores.head, scores.head.args[0]})
    return rewrite


def _score_grads(dx: torch.fx.Node, s: _Scores):
    """(dq3, dkt3, nodes) where dx, the gradient of the softmax's input in the joint graph, flows back
    through exactly the backward of the scores chain into the gradients of q3 and kt3 (either may be
    None where no gradient is asked for); None where the graph does something else with it."""
    g, nodes = dx, []
    for op in reversed(s.chain):
        if op.target is not aten.add.Tensor:       # the gradient passes through an add unchanged ...
            g = _backward_of(op, g)
            if g is None:
                return None
            nodes.append(g)
        src = _val(_score_operand(op))
        if op.target not in _CASTS and src.dtype != _val(op).dtype:
            g = _cast_of(g, src.dtype)              # ... but for the cast back where it promoted the scores
            if g is None:
                return None
            nodes.append(g)
    if len(g.users) != 1:
        return None
    (flat,) = g.users
    if flat.target not in _VIEWS or not _heads_merged(_val(g), _val(flat)):
        return None
    q3, kt3 = s.head.args[0].args
    dq3 = dkt3 = None
    for u in flat.users:
        if u.target is not aten.bmm.default:
            return None
        a, b = u.args
        if a is flat and _transposed_3d(b) is kt3 and len(b.users) == 1:
            dq3 = u
        elif b is flat and _transposed_3d(a) is q3 and len(a.users) == 1:
            dkt3 = u
        else:
            return None
        nodes += [u, a if b is flat else b]
    return (dq3, dkt3, nodes + [flat]) if dq3 is not None or dkt3 is not None else None


def _backward_of(op: torch.fx.Node, g: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The node computing the gradient of op's scores input from g, the gradient of op's output."""
    if len(g.users) != 1:
        return None
    (u,) = g.users
    t, args = op.target, op.args
    if t in _CASTS:
        return _cast_of(g, _val(args[0]).dtype)
    if t in (aten.mul.Tensor, aten.div.Tensor):
        ok = u.target is t and u.args[0] is g and u.args[1] == args[1]
    else:                                        # where: the gradient is zero where the fill was taken
        fill_first = _fill_value(args[1]) is not None
        ok = u.target is aten.where.self and u.args[0] is args[0] and \
            (u.args[2] is g and _fill_value(u.args[1]) == 0 if fill_first else
             u.args[1] is g and _fill_value(u.args[2]) == 0)
    return u if ok else None


def _cast_of(g: torch.fx.Node, dtype) -> Optional[torch.fx.Node]:
    """g's one reader, where it casts g to dtype."""
    if len(g.users) != 1:
        return None
    (u,) = g.users
    return u if u.target in _CASTS and u.args[0] is g and _val(u).dtype == dtype else None


def _transposed_3d(n) -> Optional[torch.fx.Node]:
    if isinstance(n, torch.fx.Node) and n.target is aten.permute.default and list(n.args[1]) == [0, 2, 1]:
        return n.args[0]
    return None


@dataclasses.dataclass
class _Plan:
    """The replacement of one attention: which graph values it reads and how it makes q, k, v (4-D) of them."""
    scores: _Scores
    q: torch.fx.Node
    q_flat: bool                      # q is the bmm operand [B*H, L, D]
    k: torch.fx.Node
    k_form: str                       # "k": k itself; "kt": 4-D k^T; "kt_flat": the bmm operand [B*H, D, S]
    v: torch.fx.Node
    v_flat: bool
    heads: Optional[tuple]            # (B, H) where static
    dropout_p: float
    causal: bool
    masks: list                       # the distinct mask nodes the replacement reads
    tangent: Optional[torch.fx.Node] = None     # joint graph: the gradient of the output
    t_flat: bool = False
    gqa: Optional[tuple] = None       # (k, v) unrepeated, where they were repeated for grouped-query attention
    gqa_used: bool = False            # the replacement reads gqa's k and v (set by trace)

    @classmethod
    def of(cls, s: _Scores, v3: torch.fx.Node, dropout_p: float, t3: Optional[torch.fx.Node]):
        q3, kt3 = s.head.args[0].args
        B, H, L, S = _val(s.head).shape
        D, Dv = _val(q3).shape[-1], _val(v3).shape[-1]
        heads = (B, H) if isinstance(B, int) and isinstance(H, int) else None
        q = _unflattened(q3, (B, H, L, D))
        kt = _unflattened(kt3, (B, H, D, S))
        k = _untransposed(kt) if kt is not None else None
        v = _unflattened(v3, (B, H, S, Dv))
        t = _unflattened(t3, (B, H, L, Dv)) if t3 is not None else None
        if q is None and heads is None:
            return None                   # symbolic heads: read B and H off a 4-D q
        masks = list(dict.fromkeys([m for m, _ in s.added] + [c for c, *_ in s.fills] + [c for c, _ in s.keeps]))
        causal = not s.added and not s.fills and len(s.keeps) == 1 and _is_lower_triangle(*s.keeps[0], (L, S))
        plan = cls(s, q or q3, q is None, k or kt or kt3, "k" if k is not None else "kt" if kt is not None else
                   "kt_flat", v or v3, v is None, heads, dropout_p, causal, [] if causal else masks,
                   t or t3, t is None)
        if t3 is None and k is not None and v is not None:
            gk, gv = _grouped(k), _grouped(v)
            if gk is not None and gv is not None and gk[1] == gv[1]:
                plan.gqa = (gk[0], gv[0])
        return plan

    def inputs(self) -> list:
        k, v = self.gqa if self.gqa_used else (self.k, self.v)
        return [self.q, k, v, *self.masks] + ([self.tangent] if self.tangent is not None else [])

    def trace(self, gqa: bool):
        """The replacement traced on the matched values' fake tensors, or None where SDPA would not run a
        fused kernel for them."""
        from torch._guards import detect_fake_mode
        from torch.fx.experimental.proxy_tensor import make_fx
        self.gqa_used = gqa
        vals = [_val(n) for n in self.inputs()]
        if any(v is None for v in vals):
            return None
        mode = detect_fake_mode(vals)
        with mode:
            if self.tangent is not None:
                vals[:3] = [v.detach().requires_grad_(True) for v in vals[:3]]
            try:
                gm = make_fx(self._replacement(gqa), decomposition_table=decomposition_table(),
                             tracing_mode="real", _allow_non_fake_inputs=True)(*vals)
            except RuntimeError:           # SDPA refuses these inputs (a shape or dtype it does not take)
                return None
        for n in list(gm.graph.nodes):
            if n.op == "call_function" and n.target is aten.detach.default:
                n.replace_all_uses_with(n.args[0])
                gm.graph.erase_node(n)
        ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        fused = any(getattr(t, "overloadpacket", None) in FUSED_ATTENTION for t in ops)
        return gm if fused and aten.bmm.default not in ops else None

    def _replacement(self, gqa: bool):
        n_masks, joint = len(self.masks), self.tangent is not None
        scale, p, causal = self.scores.scale, self.dropout_p, self.causal

        def attention(q, k, v, *rest):
            with torch.enable_grad():       # the views of q, k and v below are on the gradient's path
                B, H = (q.shape[0], q.shape[1]) if not self.q_flat else self.heads
                q = q.unflatten(0, (B, H)) if self.q_flat else q
                if self.k_form == "kt_flat":
                    k = k.unflatten(0, (B, H))
                k = k.transpose(-2, -1) if self.k_form != "k" else k
                v = v.unflatten(0, (B, H)) if self.v_flat else v
                q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
                mask = self._mask(rest[:n_masks], q.dtype)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                     scale=scale, enable_gqa=gqa)
                if not joint:
                    return out, out.flatten(0, 1)
                t = rest[n_masks]
                t = t.unflatten(0, (B, H)) if self.t_flat else t
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), t)
            dkt = dk.transpose(-2, -1)
            return out, out.flatten(0, 1), dq, dq.flatten(0, 1), dkt, dkt.flatten(0, 1), dv, dv.flatten(0, 1)
        return attention

    def _mask(self, values, dtype):
        """SDPA's attn_mask from the mask values (in the order of self.masks): boolean where every mask keeps
        or drops whole scores, else additive, in the query's dtype."""
        if self.causal:
            return None
        val = dict(zip(self.masks, values))
        s = self.scores
        keep = None
        for cond, negated in s.keeps:
            k = ~val[cond] if negated else val[cond]
            keep = k if keep is None else keep & k
        if not s.added and not s.fills:
            return keep
        acc = torch.promote_types(dtype, torch.float32)
        total = None
        for m, factor in s.added:
            term = val[m].to(acc) * factor if factor != 1.0 else val[m].to(acc)
            total = term if total is None else total + term
        for cond, negated, fill in s.fills:
            c = ~val[cond] if negated else val[cond]
            term = torch.where(c, _scalar(fill, acc, c), _scalar(0.0, acc, c))
            total = term if total is None else total + term
        if keep is not None:
            total = total + torch.where(keep, _scalar(0.0, acc, keep), _scalar(-math.inf, acc, keep))
        lowest = torch.finfo(dtype).min
        if lowest > torch.finfo(acc).min:
            # a fill of float32's finfo.min would round to -inf in 16 bits, and a row of -inf is a NaN in SDPA
            total = total.clamp_min(lowest)
        return total.to(dtype)


def _scalar(x: float, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), x, dtype=dtype, device=like.device)


def _is_lower_triangle(cond: torch.fx.Node, negated: bool, size) -> bool:
    """Is the boolean mask `cond` (negated) `tril(ones(L, S))`, broadcast? Read off the index arithmetic
    torch's tril and triu decompose to (any sizes), or computed here on the CPU where it is a constant of
    static sizes made some other way."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    L, S = size
    if _keeps_lower_triangle(cond, negated, L, S):
        return True
    if not (isinstance(L, int) and isinstance(S, int)):
        return False
    with unset_fake_temporarily():
        value = _constant(cond, {})
        if value is None or value.dim() < 2 or tuple(value.shape[-2:]) != (L, S) or value.dtype != torch.bool:
            return False
        value = ~value if negated else value
        return bool((value == torch.ones(L, S, dtype=torch.bool).tril()).all())


# (compare op, negated) -> the diagonal d for which `compare(j - i, d)` (negated) keeps exactly j - i <= 0
_LOWER_TRIANGLE_DIAGONAL = {(aten.le.Scalar, False): 0, (aten.lt.Scalar, False): 1, (aten.gt.Scalar, True): 0,
                            (aten.ge.Scalar, True): 1}


def _keeps_lower_triangle(cond, negated: bool, L, S) -> bool:
    """cond == `compare(arange(S)[None, :] - arange(L)[:, None], d)` [and all-true], the form of
    tril(ones(L, S), d) and triu(ones(L, S), d), keeping (after `negated`) exactly the lower triangle."""
    if cond.target is aten.logical_and.default:
        a, b = cond.args
        cond = a if _all_true(b) else b if _all_true(a) else None
    diagonal = _LOWER_TRIANGLE_DIAGONAL.get((getattr(cond, "target", None), negated))
    if diagonal is None or cond.args[1] != diagonal or not _same_shape(_val(cond), (L, S)):
        return False
    diff = cond.args[0]
    if not isinstance(diff, torch.fx.Node) or diff.target is not aten.sub.Tensor:
        return False
    cols, rows = (_arange_along(a, dim) for a, dim in zip(diff.args, (-2, -1)))
    return cols is not None and rows is not None and statically_known_true(cols == S) and \
        statically_known_true(rows == L)


def _arange_along(n, dim: int):
    """N where n is `arange(N).unsqueeze(dim)`."""
    if not isinstance(n, torch.fx.Node) or n.target is not aten.unsqueeze.default or n.args[1] != dim:
        return None
    a = n.args[0]
    if a.target is aten.arange.default or (a.target is aten.arange.start_step and a.args[0] == 0 and
                                           a.args[2:3] in ((), (1,))):
        return _val(a).shape[0]
    return None


def _all_true(n) -> bool:
    return isinstance(n, torch.fx.Node) and n.target is aten.full.default and n.args[1] is True


def _constant(n, memo: dict, budget: int = 32):
    """n's value, computed on the CPU, where n depends on no graph input (None otherwise)."""
    if not isinstance(n, torch.fx.Node):
        return n
    if n in memo:
        return memo[n]
    if n.op != "call_function" or len(memo) > budget or not isinstance(n.target, torch._ops.OpOverload) or \
            torch.Tag.nondeterministic_seeded in n.target.tags:
        return None
    val = _val(n)
    if not isinstance(val, torch.Tensor) or val.numel() > (1 << 22) or \
            not all(isinstance(d, int) for d in val.shape):
        return None
    args = [_constant(a, memo, budget) if isinstance(a, torch.fx.Node) else a for a in n.args]
    if any(a is None and isinstance(x, torch.fx.Node) for a, x in zip(args, n.args)):
        return None
    kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in n.kwargs.items()}
    if any(isinstance(v, torch.fx.Node) for v in kwargs.values()):
        return None
    memo[n] = n.target(*args, **kwargs)
    return memo[n]


# -- splicing ----------------------------------------------------------------------------------------------

_OUTPUT_NAMES = ("out", "out3", "dq", "dq3", "dkt", "dkt3", "dv", "dv3")


def _splice(gm, traced: torch.fx.GraphModule, inputs: list, fwd_anchor, bwd_anchor) -> dict:
    """Copy the traced replacement into gm: what depends on the tangent (its last input, in the joint graph)
    before bwd_anchor, the rest before fwd_anchor. Returns {output name: its node in gm}."""
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env = dict(zip(placeholders, inputs))
    backward = {placeholders[-1]} if bwd_anchor is not None else set()
    trace = fwd_anchor.meta.get("stack_trace")
    outputs = ()
    for n in traced.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            outputs = n.args[0]
            break
        if any(a in backward for a in n.all_input_nodes):
            backward.add(n)
        with gm.graph.inserting_before(bwd_anchor if n in backward else fwd_anchor):
            env[n] = gm.graph.node_copy(n, lambda a: env[a])
        if trace is not None:
            env[n].meta.setdefault("stack_trace", trace)
    return {name: env[o] for name, o in zip(_OUTPUT_NAMES, outputs)}


def _rewire(gm, old3: torch.fx.Node, new4: torch.fx.Node, new3: torch.fx.Node) -> None:
    """Readers of old3 (a [B*H, a, b] value) read new3; those that only view it back to 4-D read new4 (whose
    layout is the kernel's), unless the graph returns that view: a returned value keeps eager's strides."""
    for u in list(old3.users):
        if u.op == "call_function" and u.target in _VIEWS and _same_shape(_val(u), _val(new4)) and not _returned(u):
            u.replace_all_uses_with(new4)
            gm.graph.erase_node(u)
    old3.replace_all_uses_with(new3)


def _returned(n) -> bool:
    return any(u.op == "output" or (u.op == "call_function" and u.target in _VIEWS + (aten.permute.default,)
                                    and _returned(u)) for u in n.users)


def _erase_dead(gm, nodes: set) -> None:
    """Erase the replaced nodes nothing reads any more (random ones too, which DCE keeps)."""
    order = _position(gm)
    for n in sorted((n for n in nodes if n.graph is gm.graph), key=order, reverse=True):
        if not n.users and n.op == "call_function":
            gm.graph.erase_node(n)


def _position(gm):
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return index.__getitem__


# -- shapes ------------------------------------------------------------------------------------------------

def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _same_shape(a, b) -> bool:
    a = a.shape if isinstance(a, torch.Tensor) else a
    b = b.shape if isinstance(b, torch.Tensor) else b
    return a is not None and b is not None and len(a) == len(b) and \
        all(statically_known_true(x == y) for x, y in zip(a, b))


def _heads_merged(big, small) -> bool:
    """Is `small` ([B*H, a, b]) `big` ([B, H, a, b]) with its first two dims merged?"""
    if not (isinstance(big, torch.Tensor) and isinstance(small, torch.Tensor)) or big.dim() != 4 or small.dim() != 3:
        return False
    return statically_known_true(big.shape[0] * big.shape[1] == small.shape[0]) and \
        _same_shape(big.shape[2:], small.shape[1:])
