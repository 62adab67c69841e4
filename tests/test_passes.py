"""User FX passes at the pre-grad, joint and post-grad stages, and the pattern matcher (graph/pattern.py)
replacing an RMSNorm subgraph with a custom op that runs as an ATen fallback."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.device import backend_for
from ember.graph.pattern import Pattern, apply_patterns, register_replacement
from ember.testing import check

aten = torch.ops.aten
EPS = 1e-6
CALLS = {"rms_norm": 0}


@torch.library.custom_op("ember_test::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    CALLS["rms_norm"] += 1
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@rms_norm.register_fake
def _(x, w, eps):
    return torch.empty_like(x)


def rms_search(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rms_replace(x, w):
    return torch.ops.ember_test.rms_norm(x, w, EPS)


def rms_pattern(**kwargs):
    return Pattern(rms_search, rms_replace, [torch.randn(4, 8), torch.randn(8)], **kwargs)


def model(x, w, b):
    h = rms_search(torch.relu(x + b), w)       # the subgraph, between ops ember fuses
    return (h * 2).sum(-1), h.sigmoid()


def _inputs(device="cpu"):
    return torch.randn(6, 32, device=device), torch.randn(32, device=device), torch.randn(32, device=device)


# -- user passes at each stage --------------------------------------------------------------------------

def test_post_grad_pass_sees_forward_and_backward(device):
    seen = []

    def count(gm):
        phs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        seen.append(("backward" if any(p.startswith("tangents") for p in phs) else "forward",
                     sum(n.op == "call_function" for n in gm.graph.nodes)))

    with ember.config.patch(post_grad_passes=[count]):
        check(lambda x, w: torch.tanh(x @ w).sum(-1), torch.randn(4, 8, device=device),
              torch.randn(8, 5, device=device), grad=True)
    assert sorted(kind for kind, _ in seen) == ["backward", "forward"]
    assert all(n > 0 for _, n in seen)


def test_pre_grad_and_joint_passes_see_their_graphs(device):
    graphs = {}

    def pre(gm):
        graphs["pre_grad"] = gm

    def joint(gm):
        graphs["joint"] = gm

    with ember.config.patch(pre_grad_passes=[pre], joint_passes=[joint]):
        check(lambda x: torch.sin(x) * 3, torch.randn(5, 7, device=device), grad=True)
    pre_targets = {n.target for n in graphs["pre_grad"].graph.nodes if n.op == "call_function"}
    assert torch.sin in pre_targets                     # torch-level, before AOTAutograd
    joint_nodes = list(graphs["joint"].graph.nodes)
    assert any(n.target is aten.sin.default for n in joint_nodes)
    assert any(n.op == "placeholder" and n.name.startswith("tangents") for n in joint_nodes)


def test_a_pass_may_return_a_new_graph_module(device):
    def swap_sin_for_cos(gm):
        new = torch.fx.GraphModule(gm, gm.graph)
        for n in new.graph.nodes:
            if n.target is aten.sin.default:
                n.target = aten.cos.default
        new.recompile()
        return new

    x = torch.randn(5, 7, device=device)
    with ember.config.patch(post_grad_passes=[swap_sin_for_cos]):
        out = torch.compile(lambda a: torch.sin(a) + 1, backend="ember")(x)
    torch.testing.assert_close(out, torch.cos(x) + 1)


# -- the pattern matcher --------------------------------------------------------------------------------

def test_rms_norm_pattern_in_post_grad(device):
    pattern = rms_pattern()
    CALLS["rms_norm"] = 0
    with ember.config.patch(post_grad_passes=[pattern]):
        check(model, *_inputs(device))
    assert pattern.count == 1
    assert CALLS["rms_norm"] == 1                       # the custom op ran, inside the compiled graph
    assert ember.metrics.fallbacks["ember_test.rms_norm.default"] == 1
    assert ember.metrics.generated_kernel_count >= 1    # the ops around it still became kernels


def test_pattern_apply_counts_replacements():
    def two_norms(x, y, w):
        return rms_search(x, w) + rms_search(y.exp(), w)

    gm = make_fx(two_norms, tracing_mode="fake")(torch.randn(3, 8), torch.randn(3, 8), torch.randn(8))
    pattern = rms_pattern()
    assert pattern.apply(gm) == 2
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.ember_test.rms_norm.default) == 2 and aten.rsqrt.default not in targets
    new = [n for n in gm.graph.nodes if n.target is torch.ops.ember_test.rms_norm.default]
    assert all(tuple(n.meta["val"].shape) == (3, 8) for n in new)   # metadata for lowering, right shapes
    assert pattern.apply(gm) == 0
    x, y, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(gm(x, y, w), two_norms(x, y, w))


def test_pattern_does_not_fire_on_other_literals(device):
    pattern = rms_pattern()

    def other_eps(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    with ember.config.patch(post_grad_passes=[pattern]):
        check(other_eps, torch.randn(4, 16, device=device), torch.randn(16, device=device))
    assert pattern.count == 0


def test_pattern_skips_a_match_whose_inner_values_are_used_elsewhere(device):
    pattern = rms_pattern()

    def leaky(x, w):
        ms = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms + EPS) * w, ms
    with ember.config.patch(post_grad_passes=[pattern]):
        check(leaky, torch.randn(4, 16, device=device), torch.randn(16, device=device))
    assert pattern.count == 0


def test_extra_check_can_veto(device):
    seen = []

    def only_wide(inputs):
        seen.append(sorted(inputs))
        return inputs["x"].meta["val"].shape[-1] >= 64

    pattern = rms_pattern(extra_check=only_wide)
    with ember.config.patch(post_grad_passes=[pattern]):
        check(model, *_inputs(device))
    assert pattern.count == 0 and seen == [["w", "x"]]


def test_register_replacement_and_apply_patterns():
    passes = []
    p = register_replacement(rms_search, rms_replace, [torch.randn(2, 4), torch.randn(4)], passes)
    assert passes == [p]
    gm = make_fx(rms_search, tracing_mode="fake")(torch.randn(5, 8), torch.randn(8))
    assert apply_patterns(gm, passes) == 1


def test_pre_grad_pattern_traced_at_torch_level(device):
    pattern = rms_pattern(trace="torch")
    CALLS["rms_norm"] = 0
    with ember.config.patch(pre_grad_passes=[pattern]):
        check(model, *_inputs(device))
    assert pattern.count == 1 and CALLS["rms_norm"] == 1


def test_pattern_inputs_must_match():
    with pytest.raises(ValueError, match="same inputs"):
        Pattern(rms_search, lambda x: x * 2, [torch.randn(4, 8), torch.randn(8)], name="bad").apply(
            make_fx(rms_search)(torch.randn(4, 8), torch.randn(8)))


def test_replacement_with_a_constant_tensor(device):
    def search(x):
        return x.sin() * 2

    def replace(x):
        return x.cos() + torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)

    pattern = Pattern(search, replace, [torch.randn(3, 4, device=device)])
    x = torch.randn(5, 4, device=device)
    with ember.config.patch(post_grad_passes=[pattern]):
        out = torch.compile(lambda a: search(a) + 1, backend="ember")(x)
    assert pattern.count == 1
    torch.testing.assert_close(out, replace(x) + 1)


def test_torch_level_patterns_must_take_the_same_inputs():
    with pytest.raises(ValueError, match="same inputs"):
        Pattern(rms_search, lambda x, w, z: x, [], trace="torch").apply(torch.fx.symbolic_trace(rms_search))


def test_replacement_may_ignore_an_input():
    def search(x, y):
        return (x + y) * 0

    def replace(x, y):
        return torch.zeros_like(x)

    gm = make_fx(lambda a, b: search(a, b).exp(), tracing_mode="fake")(torch.randn(4), torch.randn(4))
    assert Pattern(search, replace, [torch.randn(4), torch.randn(4)]).apply(gm) == 1
    torch.testing.assert_close(gm(torch.randn(4), torch.randn(4)), torch.ones(4))


def _sum_then_double(x, dim):
    return x.sum(dim) * 2


def _double_then_sum(x, dim):
    return (x * 2).sum(dim)


def test_a_literal_input_matches_any_literal_and_reaches_the_replacement(device):
    """dim's example (-1) is a literal input: the pattern matches sums over any dim, extra_check sees the
    dim each match has, and the replacement sums over that dim."""
    seen = []
    pattern = Pattern(_sum_then_double, _double_then_sum, [torch.randn(3, 4), -1],
                      extra_check=lambda match: seen.append(match["dim"]) is None)

    def f(a, b):
        return _sum_then_double(a, 0) + _sum_then_double(b, 1).exp()

    a, b = torch.randn(5, 6, device=device), torch.randn(6, 5, device=device)
    gm = make_fx(f, tracing_mode="fake")(a, b)
    assert pattern.apply(gm) == 2 and sorted(seen) == [0, 1]
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    assert sorted(n.args[1] for n in sums) == [[0], [1]]
    assert all(n.args[0].target is aten.mul.Tensor for n in sums)
    torch.testing.assert_close(gm(a, b), f(a, b))
    with ember.config.patch(post_grad_passes=[pattern]):
        check(f, a, b)
    assert pattern.count == 4


def test_a_literal_input_must_appear_once_per_value():
    with pytest.raises(ValueError, match="appears as no op's argument"):
        Pattern(lambda x, scale: x.sum(-1) * 2, lambda x, scale: x, [torch.randn(3, 4), 3.0]).search_graph
    with pytest.raises(ValueError, match="distinct example values"):
        Pattern(lambda x, i, j: x.sum(i) + x.sum(j), lambda x, i, j: x, [torch.randn(3, 4), 1, 1]).search_graph


def _max_and_exp_sum(x):
    m = x.amax(-1, keepdim=True)
    return m, (x - m).exp().sum(-1, keepdim=True)


def _online_max_and_exp_sum(x):
    m, total = torch.ops.ember.softmax_stats(x, -1)
    return m, total


def test_a_pattern_with_several_outputs_replaces_each(device):
    """The search function returns two values, both read outside the match: each is replaced by the
    replacement's value at its position (swapped, the values would differ)."""
    pattern = Pattern(_max_and_exp_sum, _online_max_and_exp_sum, [torch.randn(2, 8)])

    def f(x):
        m, total = _max_and_exp_sum(x)
        return x - m - total.log(), m * 3

    x = torch.randn(6, 40, device=device) * 3
    gm = make_fx(f, tracing_mode="fake")(x)
    assert pattern.apply(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.ember.softmax_stats.default in targets and aten.amax.default not in targets
    stats = next(n for n in gm.graph.nodes if n.target is torch.ops.ember.softmax_stats.default)
    assert [tuple(v.shape) for v in stats.meta["val"]] == [(6, 1), (6, 1)]
    for got, want in zip(gm(x), f(x)):
        torch.testing.assert_close(got, want)


def test_extra_check_sees_the_matched_outputs():
    """match.outputs are the graph nodes the search function's results matched: here only the sin that
    a multiplication reads is rewritten. extra_check is asked once per match."""
    calls = []

    def read_by_mul(match):
        calls.append(match.outputs)
        return all(u.target is aten.mul.Tensor for u in match.outputs[0].users)

    pattern = Pattern(lambda x: x.sin(), lambda x: x.cos(), [torch.randn(3)], extra_check=read_by_mul)

    def f(a, b):
        return a.sin() * 2, b.sin() + 2

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    assert pattern.apply(gm) == 1 and len(calls) == 2
    a, b = torch.randn(4), torch.randn(4)
    for got, want in zip(gm(a, b), (a.cos() * 2, b.sin() + 2)):
        torch.testing.assert_close(got, want)


def test_a_replacement_constant_does_not_take_the_graph_constant_of_its_name():
    """The graph and the replacement each hold a constant tensor named by tracing (`_tensor_constant0`):
    the copied one gets a name of its own."""
    def search(x):
        return x.sin() * 2

    def replace(x):
        return x.cos() + torch.tensor([10.0, 20.0, 30.0, 40.0])

    def f(x):
        return search(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])

    gm = make_fx(f)(torch.randn(3, 4))
    assert Pattern(search, replace, [torch.randn(2, 4)]).apply(gm) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), replace(x) + torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_a_replacement_may_return_its_input():
    pattern = Pattern(lambda x: x.clone(), lambda x: x, [torch.randn(3)])
    gm = make_fx(lambda x: x.clone().exp() + x.clone(), tracing_mode="fake")(torch.randn(4))
    assert pattern.apply(gm) == 2
    assert not any(n.target is aten.clone.default for n in gm.graph.nodes)
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x.exp() + x)


# -- ember's own post-grad passes -----------------------------------------------------------------------

def test_casts_to_the_dtype_a_value_has_are_removed():
    from ember.graph.passes.post_grad import remove_noop_casts
    prims = torch.ops.prims

    def f(x):
        return prims.convert_element_type.default(x, torch.float32) * 2, \
            prims.convert_element_type.default(x, torch.float64).sum()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 5))
    remove_noop_casts(gm)
    gm.recompile()
    casts = [n.args[1] for n in gm.graph.nodes if n.target is prims.convert_element_type.default]
    assert casts == [torch.float64]
    x = torch.randn(4, 5)
    for got, want in zip(gm(x), f(x)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_statistics_pattern_keeps_the_dim_and_leaves_narrow_rows(monkeypatch, dim):
    """post_grad.online_softmax_stats: softmax's max and sum of exp over any one dim become
    ember::softmax_stats over that dim; float16 rows (which the decompositions upcast first) are left."""
    from ember.graph.decompose import decomposition_table
    from ember.graph.passes.post_grad import online_softmax_stats
    monkeypatch.setattr(backend_for("cpu"), "reads_rows_online", True)

    def f(x, y):
        return torch.ops.aten._softmax(x, dim, False), torch.amax(y, dim, keepdim=True) + \
            torch.exp(y - torch.amax(y, dim, keepdim=True)).sum(dim, keepdim=True)

    x, y = torch.randn(6, 7), torch.randn(6, 7, dtype=torch.float16)
    gm = make_fx(f, decomposition_table=decomposition_table(), tracing_mode="fake")(x, y)
    online_softmax_stats(gm)
    gm.recompile()
    stats = [n for n in gm.graph.nodes if n.target is torch.ops.ember.softmax_stats.default]
    assert len(stats) == 1 and stats[0].args[1] in (dim, dim % 2)
    for got, want in zip(gm(x, y), f(x, y)):
        torch.testing.assert_close(got, want)


def test_extending_doc_snippets_run():
    import os
    import re
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "extending.md")
    with open(path) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 5
    # a real module: Dynamo on some torch versions imports a traced function's module by name
    import sys
    import types
    module = types.ModuleType("extending_doc")
    sys.modules["extending_doc"] = module
    namespace = module.__dict__
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/extending.md[block {i}]", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/extending.md python block {i} failed: {type(e).__name__}: {e}") from e


@pytest.mark.parametrize("dim", [1, 0])
def test_scatter_into_constant_becomes_a_pointwise(device, dim):
    """Cross-entropy's backward scatters one value per row into zeros: ember rewrites it into a compare
    with arange, fused into the gradient kernel, so no [rows, classes] buffer is filled and scattered."""
    from ember.graph.passes.post_grad import scatter_into_constant
    x = torch.randn(16, 300, device=device)
    t = torch.randint(0, x.shape[dim], (16, 1) if dim == 1 else (1, 300), device=device)

    def f(x, t):
        return torch.zeros_like(x).scatter(dim, t, -2.5) * x + x.exp()
    gm = make_fx(f)(x, t)
    scatter_into_constant(gm)
    assert not any(n.target is aten.scatter.value for n in gm.graph.nodes)
    check(f, x, t)
    assert ember.metrics.buffers_allocated == 1 and ember.metrics.generated_kernel_count == 1


def test_cross_entropy_backward_keeps_no_scattered_buffer(device):
    import torch.nn.functional as F
    x = torch.randn(32, 500, device=device)
    t = torch.randint(0, 500, (32,), device=device)
    check(lambda x, t: F.cross_entropy(x, t), x, t, grad=True)
    # forward: the loss, its row statistics and saved values; backward: the gradient alone
    assert ember.metrics.buffers_allocated <= 6, ember.metrics.buffers_allocated


def _force_padding(monkeypatch, device):
    """pad_matmuls on any device and size, float32 included: on the CPU the values are then exact; on a
    GPU cuBLAS may run a padded float32 GEMM at TF32-like precision (why the pass leaves float32 alone
    there), hence the looser tolerance it returns."""
    from ember.graph.passes import post_grad
    monkeypatch.setattr(backend_for(device), "matmul_alignment", 16)
    monkeypatch.setattr(post_grad, "PAD_MATMUL_MIN_MACS", 0)
    monkeypatch.setattr(post_grad, "_PADDED_MATMUL_DTYPES", (torch.float32,))


def _padding_tolerance(device):
    return {"rtol": 2e-3, "atol": 2e-3} if torch.device(device).type == "cuda" else {}


@pytest.mark.parametrize("shape", [(200, 96, 1001), (203, 97, 96), (64, 64, 64)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad", [True, False])
def test_misaligned_matmuls_run_padded_and_sliced(device, monkeypatch, shape, bias, grad):
    """post_grad.pad_matmuls: M, K or N off the device's matmul alignment are zero-padded and the result
    sliced back, in training and inference graphs; values and gradients match eager, and an aligned
    matmul is left alone."""
    _force_padding(monkeypatch, device)
    seen = []
    M, K, N = shape
    a, w, b = torch.randn(M, K, device=device), torch.randn(N, K, device=device), torch.randn(N, device=device)
    # sin saves its input, the matmul's result, for the backward: a forward output the backward graph
    # reads with the strides it was traced with
    fn = (lambda x, w, b: F.linear(x.relu(), w, b).sin()) if bias else (lambda x, w, b: (x.relu() @ w.t()).sin())
    with torch.set_grad_enabled(grad), \
            ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        check(fn, a, w, b, grad=grad, **_padding_tolerance(device))
    assert (aten.constant_pad_nd.default in seen) == (shape != (64, 64, 64))


def test_padded_operands_are_shared_and_padded_in_storage_order(device, monkeypatch):
    """y = x @ w.t() with N = 1001: the forward pads w's rows (w.t() is padded as w, then transposed back:
    no transposing copy); the backward's two matmuls read the output gradient as is (K padded) and
    transposed (M padded), and share one padded copy of it."""
    _force_padding(monkeypatch, device)
    graphs = []
    x, w = torch.randn(200, 96, device=device), torch.randn(1001, 96, device=device)
    with ember.config.patch(post_grad_passes=[lambda gm: graphs.append(list(gm.graph.nodes))]):
        check(lambda x, w: x @ w.t(), x, w, grad=True, **_padding_tolerance(device))
    pads = [[n for n in nodes if n.target is aten.constant_pad_nd.default] for nodes in graphs]
    assert [len(p) for p in pads] == [1, 2], pads
    assert all(p.args[0].op == "placeholder" for p in pads[0] + pads[1])   # w, the gradient: never a permute


def test_padded_matmul_returned_through_a_view_keeps_eager_strides(device, monkeypatch):
    """GPT-2's LM head in training: the logits, a reshaped view of the padded product sliced back, are
    returned and saved for the backward graph, which was compiled for eager's dense strides. Returned
    with the padded row stride instead, the gradients come out wrong."""
    _force_padding(monkeypatch, device)
    B, S, H, V = 2, 48, 64, 1001

    def fn(h, w, t):
        logits = (h.view(-1, H) @ w.t()).view(B, S, V)
        return F.cross_entropy(logits.float().view(-1, V), t), logits

    h, w = torch.randn(B, S, H, device=device), torch.randn(V, H, device=device)
    t = torch.randint(0, V, (B * S,), device=device)
    copies = []
    monkeypatch.setattr(backend_for(device), "runtime_row_copy_ahead", lambda *a: copies.append(a))
    loss, logits = check(fn, h, w, t, grad=True, **_padding_tolerance(device))
    assert logits.stride() == (S * V, V, 1)
    # ember::padded_mm copies the product's rows, V of V + 3 (16 bytes of float32), into the dense result:
    # the backend was asked to build that copy while the graph compiled
    assert copies == [(torch.float32, V, V + 3, V)], copies


def _forward_outputs(monkeypatch):
    """A list that receives the outputs of every call of each graph ember compiles, graph by graph."""
    import sys
    cg = sys.modules["ember.compile_graph"]          # the module: the package's attribute is the function
    seen, real = [], cg._compile

    def compile_and_watch(*a):
        graph = real(*a)
        calls, run = [], graph.fn
        seen.append(calls)
        graph.fn = lambda args: (lambda outs: calls.append(outs) or outs)(run(args))
        return graph
    monkeypatch.setattr(cg, "_compile", compile_and_watch)
    return seen


def test_a_padded_result_returned_twice_is_copied_once(device, monkeypatch):
    """y, a padded product sliced back, is both a user output and saved for sin's backward: the forward
    graph returns it twice, and both are the one dense copy (there were two, a logits-sized buffer more
    in GPT-2's and BERT's training steps)."""
    _force_padding(monkeypatch, device)
    seen = _forward_outputs(monkeypatch)
    x, w = torch.randn(64, 96, device=device), torch.randn(1001, 96, device=device)

    def fn(x, w):
        y = x @ w.t()
        return y.sin(), y
    check(fn, x, w, grad=True, **_padding_tolerance(device))
    forward_outs = seen[0][0]
    ys = [t for t in forward_outs if isinstance(t, torch.Tensor) and t.shape == (64, 1001)]
    assert len(ys) == 3, [t.shape for t in forward_outs]              # sin(y), y, y saved
    assert len({t.data_ptr() for t in ys}) == 2
    assert all(t.is_contiguous() for t in ys)


def test_a_computed_operand_is_padded_where_it_is_computed(device, monkeypatch):
    """Cross-entropy over 1001 classes: the backward's logits gradient, computed in the graph, feeds the
    input-gradient matmul (K padded), the weight-gradient matmul (M padded, transposed) and the bias
    gradient (a sum). It is padded where it is computed and the sum reads the padded tensor sliced back,
    so only the padded form is stored (it was stored both ways: a logits-sized buffer more)."""
    _force_padding(monkeypatch, device)
    graphs = []
    h, w, b = (torch.randn(200, 96, device=device), torch.randn(1001, 96, device=device),
               torch.randn(1001, device=device))
    t = torch.randint(0, 1001, (200,), device=device)
    # the cross-entropy of a linear is otherwise one chunked op (graph/passes/linear_cross_entropy.py)
    with ember.config.patch(post_grad_passes=[lambda gm: graphs.append(gm.graph)], fused_linear_cross_entropy=False):
        check(lambda h, w, b: F.cross_entropy(F.linear(h, w, b), t), h, w, b, grad=True,
              **_padding_tolerance(device))
    backward = graphs[1]
    pads = [n for n in backward.nodes if n.target is aten.constant_pad_nd.default]
    computed = [p.args[0] for p in pads if p.args[0].op == "call_function"]
    assert computed and all(list(x.users) == [p] for x in computed for p in pads if p.args[0] is x), \
        [(x, list(x.users)) for x in computed]


@pytest.mark.parametrize("chunk_bytes", [1 << 12, 1 << 30])
def test_a_returned_padded_product_is_computed_in_row_chunks(device, monkeypatch, chunk_bytes):
    """A returned result padded along N is ember::padded_mm: the product a chunk of rows at a time into
    the dense result (one chunk, or many with a small chunk size), so no whole padded product is stored
    beside the dense copy; values and gradients match eager."""
    from ember.graph import custom_ops as ops
    _force_padding(monkeypatch, device)
    monkeypatch.setattr(ops, "PADDED_MM_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(ops, "PADDED_MM_MIN_ROWS", 16)
    seen = []
    x, w, b = torch.randn(203, 96, device=device), torch.randn(1001, 96, device=device), torch.randn(1001, device=device)
    with ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        out = check(lambda x, w, b: F.linear(x, w, b), x, w, b, grad=True, **_padding_tolerance(device))
    assert out.is_contiguous()
    assert ops.padded_mm in seen


@pytest.mark.parametrize("chunk_bytes", [1 << 10, 1 << 30])
def test_a_large_input_is_padded_a_chunk_at_a_time_by_each_product(device, monkeypatch, chunk_bytes):
    """With config.chunked_input_pads, a graph input of PAD_INPUT_WHOLE_MAX_BYTES or more (here any) is
    never padded whole: its products copy a chunk at a time into an aligned buffer, so no padded copy sits
    beside it while the graph runs (GPT-2's logits gradient). The backward of x @ w.t() (M = 203, K = 96,
    N = 1001) reads its incoming gradient, reshaped, as is and transposed (rows and columns misaligned):
    both products are one ember::chunk_padded_mm_pair, one loop over the gradient's column chunks. The
    forward of a linear with its bias reads a misaligned input (K = 1001): ember::chunk_padded_mm. Many
    chunks (the last one partial) or one; values and gradients match eager."""
    from ember.graph import custom_ops as ops
    from ember.graph.passes import post_grad
    _force_padding(monkeypatch, device)
    monkeypatch.setattr(post_grad, "PAD_INPUT_WHOLE_MAX_BYTES", 0)
    monkeypatch.setattr(ember.config, "chunked_input_pads", True)
    monkeypatch.setattr(ops, "PADDED_MM_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(ops, "PAIR_CHUNK_BYTES", chunk_bytes * 100)      # chunks of 64 columns, or one
    monkeypatch.setattr(ops, "PADDED_MM_MIN_ROWS", 16)
    # a chunk's product sums its K terms in another order than the whole one (float32 on the CPU: 2.5e-5
    # on sums of 1001 unit-scale terms)
    tol = _padding_tolerance(device) or {"rtol": 1e-4, "atol": 1e-4}
    # every row copy the chunked products launch was asked for ahead, while the graph compiled
    from ember.runtime import row_copy
    asked, launched, copy_rows = set(), set(), row_copy.copy_rows
    monkeypatch.setattr(backend_for(device), "runtime_row_copy_ahead", lambda *a: asked.add(a))

    def recorded_copy(dst, src):
        launched.add((dst.dtype, dst.shape[1], src.stride(0), dst.stride(0)))
        copy_rows(dst, src)
    monkeypatch.setattr(row_copy, "copy_rows", recorded_copy)
    graphs = []
    # [7, 29, 96] tokens: the backward reads its [7, 29, 1001] gradient through a reshape
    x, w = torch.randn(7, 29, 96, device=device), torch.randn(1001, 96, device=device)
    with ember.config.patch(post_grad_passes=[lambda gm: graphs.append(gm.graph)]):
        check(lambda x, w: (x.view(203, 96) @ w.t()).view(7, 29, 1001), x, w, grad=True, **tol)
    backward = graphs[1]
    align = 16 // x.element_size()                  # _force_padding aligns rows to 16 bytes
    pairs = [n.args[3:] for n in backward.nodes if n.target is ops.chunk_padded_mm_pair]
    assert pairs == [(-203 % align, -1001 % align)]
    assert not any(n.target in (ops.chunk_padded_mm, aten.mm.default) for n in backward.nodes)
    assert not any(n.target is aten.constant_pad_nd.default and n.args[0].meta["val"].numel() == 203 * 1001
                   for n in backward.nodes)

    graphs.clear()
    h, w2 = torch.randn(203, 1001, device=device), torch.randn(96, 1001, device=device)
    b2 = torch.randn(96, device=device)
    with torch.no_grad(), ember.config.patch(post_grad_passes=[lambda gm: graphs.append(gm.graph)]):
        check(lambda h, w, b: F.linear(h, w, b), h, w2, b2, **tol)
    assert [n.args[1] for n in graphs[0].nodes if n.target is ops.chunk_padded_mm] == [False]
    assert launched and launched <= asked, (launched, asked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [128, 1001])
def test_a_chunk_padded_product_pair_is_both_padded_products(device, monkeypatch, dtype, cols):
    """ember::chunk_padded_mm_pair(g, b, bt, pad_rows, pad_cols) against the two products of g padded
    whole: chunks of 64 columns, the last one partial (1001) or made only of padding (128 + 4)."""
    from ember.graph import custom_ops as ops
    monkeypatch.setattr(ops, "PADDED_MM_MIN_ROWS", 16)
    pad_rows, pad_cols = 1, 4
    monkeypatch.setattr(ops, "PAIR_CHUNK_BYTES", (203 + pad_rows) * 64 * torch.tensor([], dtype=dtype).element_size())
    g = torch.randn(203, cols, device=device, dtype=dtype)
    b = torch.randn(cols + pad_cols, 96, device=device, dtype=dtype)
    bt = torch.randn(203 + pad_rows, 80, device=device, dtype=dtype)
    padded = F.pad(g.double(), [0, pad_cols, 0, pad_rows])
    out, out_t = ops.chunk_padded_mm_pair(g, b, bt, pad_rows, pad_cols)
    assert out.dtype == out_t.dtype == dtype
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.double(), padded @ b.double(), rtol=tol, atol=tol * cols ** 0.5)
    torch.testing.assert_close(out_t.double(), padded.t() @ bt.double(), rtol=tol, atol=tol * 203 ** 0.5)


def test_an_inference_graph_returns_a_padded_product_with_its_padded_strides(device, monkeypatch):
    """GPT-2's LM head in inference: the logits, a view of the product padded along N, are returned with
    the padded row stride (as inductor returns them), values as eager's: no dense copy, no row chunks
    (ember::padded_mm's chunks made GPT-2 inference 4.1-5.3 ms per step back to back against 2.6)."""
    from ember.graph import custom_ops as ops
    _force_padding(monkeypatch, device)
    seen = []
    B, S, H, V = 2, 48, 64, 1001
    h, w = torch.randn(B, S, H, device=device), torch.randn(V, H, device=device)
    with torch.no_grad(), \
            ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        logits = check(lambda h, w: (h.view(-1, H) @ w.t()).view(B, S, V), h, w, **_padding_tolerance(device))
    assert ops.padded_mm not in seen and aten.constant_pad_nd.default in seen
    padded = V + -V % (16 // h.element_size())          # _force_padding aligns rows to 16 bytes
    assert logits.stride() == (S * padded, padded, 1), logits.stride()


def test_an_inference_product_that_only_a_copy_can_reshape_is_returned_dense(device, monkeypatch):
    """The padded product flattened (a view no padded stride allows): ember::padded_mm, dense."""
    from ember.graph import custom_ops as ops
    _force_padding(monkeypatch, device)
    seen = []
    x, w = torch.randn(64, 96, device=device), torch.randn(1001, 96, device=device)
    with torch.no_grad(), \
            ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        out = check(lambda x, w: (x @ w.t()).view(-1), x, w, **_padding_tolerance(device))
    assert ops.padded_mm in seen and out.is_contiguous()


@pytest.mark.parametrize("returned", [False, True])
def test_a_matmul_bias_feeding_pointwise_ops_is_added_in_their_kernel(device, monkeypatch, returned):
    """gelu(linear(x, w, b)): the bias is added by the GELU's kernel, not by the GEMM (under bf16 autocast
    after a cast kernel of its own). Where the product itself is returned, the addmm stays. Float32: the
    Triton interpreter truncates bf16 casts where a GPU rounds."""
    monkeypatch.setattr(backend_for(device), "adds_matmul_bias_in_epilogue", True)
    seen = []
    x, w, b = (torch.randn(64, 96, device=device), torch.randn(128, 96, device=device),
               torch.randn(128, device=device))

    def fn(x, w, b):
        y = F.linear(x, w, b)
        return (F.gelu(y), y) if returned else F.gelu(y)
    with ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        check(fn, x, w, b, rtol=1e-4, atol=1e-4)
    assert (aten.addmm.default in seen) == returned
    assert (aten.mm.default in seen) == (not returned)


@pytest.mark.parametrize("channels_last", [False, True], ids=["as_traced", "channels_last"])
@pytest.mark.usefixtures("exact_float32_convolutions")
def test_a_convolution_bias_is_added_by_the_next_kernel(device, monkeypatch, channels_last):
    """conv2d(x, w, b) then GELU: the convolution runs without its bias and the GELU's kernel adds it; the
    backward's convolution computes no bias gradient, ember's kernels sum it; outputs and the gradients of
    input, weight and bias match eager's."""
    monkeypatch.setattr(backend_for(device), "adds_convolution_bias_in_epilogue", True)
    seen, masks = [], []

    def record(gm):
        seen.extend(n.args[2] for n in gm.graph.nodes if n.target is aten.convolution.default)
        masks.extend(n.args[10] for n in gm.graph.nodes if n.target is aten.convolution_backward.default)
    x, w, b = (torch.randn(2, 8, 9, 9, device=device), torch.randn(16, 8, 3, 3, device=device),
               torch.randn(16, device=device))
    with ember.config.patch(post_grad_passes=[record], conv_layout="channels_last" if channels_last else "as_traced"):
        check(lambda x, w, b: F.gelu(F.conv2d(x, w, b, padding=1)), x, w, b, grad=True, rtol=1e-4, atol=1e-4)
    assert seen and all(bias is None for bias in seen)
    assert masks and all(list(m) == [True, True, False] for m in masks)


@pytest.mark.parametrize("needs", [(True, True), (False, True), (False, False)], ids=["x_w", "w", "none"])
@pytest.mark.usefixtures("exact_float32_convolutions")
def test_a_convolution_bias_gradient_is_summed_by_ember(device, monkeypatch, needs):
    """Where only some of a convolution's operands need gradients (a frozen input, a frozen weight) the
    backward keeps what is asked for and sums the bias gradient itself. In bf16, eager rounds the incoming
    gradient after each op and ember once, so both are compared with float32 eager: ember's error within
    twice eager's."""
    monkeypatch.setattr(backend_for(device), "adds_convolution_bias_in_epilogue", True)
    masks = []

    def record(gm):
        masks.extend(list(n.args[10]) for n in gm.graph.nodes if n.target is aten.convolution_backward.default)
    from ember.testing import assert_close, fresh_compile

    def fn(x, w, b):
        return (F.conv2d(x, w, b, stride=2) * 1.5).sin()

    def run(f, inputs, g):
        args = [t.clone().requires_grad_(r) for t, r in zip(inputs, needs + (True,))]
        out = f(*args)
        out.backward(g)
        return [out] + [t.grad for t in args if t.requires_grad]
    for dtype in (torch.float32, torch.bfloat16):
        inputs = (torch.randn(2, 6, 7, 7, device=device, dtype=dtype), torch.randn(10, 6, 3, 3, device=device,
                  dtype=dtype), torch.randn(10, device=device, dtype=dtype))
        g = torch.randn(2, 10, 3, 3, device=device, dtype=dtype)
        with ember.config.patch(post_grad_passes=[record]):
            ours, eager = run(fresh_compile(fn), inputs, g), run(fn, inputs, g)
        if dtype == torch.float32:
            assert_close(ours, eager, 1e-4, 1e-4)
            continue
        exact = run(fn, [t.float() for t in inputs], g.float())
        for a, e, x in zip(ours, eager, exact):
            assert (a.float() - x).abs().max() <= 2 * (e.float() - x).abs().max() + 1e-2
    assert len(masks) == 2 and all(m == [needs[0], needs[1], False] for m in masks) if any(needs) else not masks


def test_float32_matmuls_keep_their_sizes(device, monkeypatch):
    """Unforced, float32 is left alone (on a GPU a padded float32 GEMM may run at TF32's precision)."""
    from ember.graph.passes import post_grad
    monkeypatch.setattr(backend_for(device), "matmul_alignment", 16)
    monkeypatch.setattr(post_grad, "PAD_MATMUL_MIN_MACS", 0)
    seen = []
    a, w = torch.randn(200, 96, device=device), torch.randn(1001, 96, device=device)
    with ember.config.patch(post_grad_passes=[lambda gm: seen.extend(n.target for n in gm.graph.nodes)]):
        check(lambda x, w: (x @ w.t()).sin(), a, w, grad=True)
    assert aten.mm.default in seen and aten.constant_pad_nd.default not in seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dynamo_multiply_adds_are_computed_as_their_ops(device, dtype):
    """Dynamo traces addcmul_ / addcdiv_ with a value, and add_ with a tensor alpha, as prims.fma of a
    materialized product: restore_multiply_adds makes them addcmul / addcdiv / add again, lowered (no ATen
    call) and rounded once as in eager, so the updated tensor is eager's to one rounding of the dtype."""
    ulp = {torch.float32: 1.3e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    steps = {
        "addcmul_": lambda x, a, b: x.addcmul_(a, b, value=0.37),
        "addcdiv_": lambda x, a, b: x.addcdiv_(a, b, value=-3.1),
        "add_ with a tensor alpha": lambda x, a, b: x.add_(a, alpha=b[0, 0]),
    }
    for what, step in steps.items():
        x = torch.randn(64, 33, device=device, dtype=dtype) * 4
        a = torch.randn(64, 33, device=device, dtype=dtype) * 4
        b = torch.randn(64, 33, device=device, dtype=dtype) * 4
        expected = x.clone()
        step(expected, a, b)
        torch._dynamo.reset()
        ember.metrics.reset()
        actual = x.clone()
        torch.compile(step, backend="ember")(actual, a, b)
        torch.testing.assert_close(actual, expected, rtol=ulp, atol=1e-5, msg=lambda m: f"{what}: {m}")
        assert not ember.metrics.fallbacks, (what, dict(ember.metrics.fallbacks))
