"""Dynamic shapes: one compile serves every batch size and sequence length.

Every test counts compiles two ways: Dynamo frames handed to ember (a counting wrapper around
`ember.backend`) and `ember.metrics.graphs_compiled` (compile_graph calls: one per inference graph, two
per training graph: forward + backward), and compares outputs (and gradients where training) with eager.

Dynamo specializes sizes 0 and 1 (a symbol always stands for a size >= 2), so the first call of every
test uses sizes >= 2; a later call with a size of 0 or 1 is a new specialization and compiles once more,
which the tests assert explicitly.
"""
import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.testing import assert_close
from tests.models.test_models import MLP, Classifier, EncoderBlock, TinyTransformer


class CountingBackend:
    """ember.backend, counting the Dynamo graphs it compiles. Only calls that return count: with
    dynamic=True Dynamo first traces float module attributes (LayerNorm's eps) as tensors and, when the
    graph specializes them, aborts the backend call with TensorifyScalarRestartAnalysis and traces again;
    that aborted attempt compiles nothing."""

    def __init__(self):
        self.frames = 0

    def __call__(self, gm, example_inputs, **kwargs):
        out = ember.backend(gm, example_inputs, **kwargs)
        self.frames += 1
        return out


def compile_counted(fn, dynamic=True):
    torch._dynamo.reset()
    ember.metrics.reset()
    counter = CountingBackend()
    return torch.compile(fn, backend=counter, dynamic=dynamic), counter


def assert_compiles(counter, frames, training=False):
    assert counter.frames == frames, f"{counter.frames} Dynamo graphs compiled, expected {frames}"
    per_frame = 2 if training else 1
    assert ember.metrics.graphs_compiled == frames * per_frame, \
        f"ember compiled {ember.metrics.graphs_compiled} graphs, expected {frames * per_frame}"
    assert ember.metrics.eager_fallbacks == 0


def run_and_compare(fn, compiled, *args, rtol=None, atol=None, what="output"):
    expected = fn(*args)
    actual = compiled(*args)
    assert_close(actual, expected, rtol, atol, what=what)
    return actual


# --- (1) small models over several batch sizes and sequence lengths ---------------------------------------


@torch.no_grad()
def test_mlp_eval_batch_sizes():
    model = MLP().eval()
    compiled, counter = compile_counted(copy.deepcopy(model))
    for b in (3, 16, 5, 33, 64):
        x, t = torch.randn(b, 32), torch.randint(0, 10, (b,))
        run_and_compare(model, compiled, x, t, what=f"batch {b}")
    assert_compiles(counter, 1)


def _train_compare(model, batches, loss_fn=None, lr=0.05, rtol=1e-4, atol=1e-4):
    """Train eager and compiled copies side by side over batches of varying shape; compare loss, grads, params."""
    ours = copy.deepcopy(model)
    compiled, counter = compile_counted(ours)
    opt_e = torch.optim.SGD(model.parameters(), lr=lr)
    opt_c = torch.optim.SGD(ours.parameters(), lr=lr)
    for step, batch in enumerate(batches):
        out_e, out_c = model(*batch), compiled(*batch)
        assert_close(out_c, out_e, rtol, atol, what=f"step {step} output")
        loss_e = out_e if loss_fn is None else loss_fn(out_e)
        loss_c = out_c if loss_fn is None else loss_fn(out_c)
        loss_e.backward()
        loss_c.backward()
        for (name, pe), pc in zip(model.named_parameters(), ours.parameters()):
            assert_close(pc.grad, pe.grad, rtol, atol, what=f"step {step} grad of {name}")
        for opt in (opt_e, opt_c):
            opt.step()
            opt.zero_grad()
    for (name, pe), pc in zip(model.named_parameters(), ours.parameters()):
        assert_close(pc, pe, rtol, atol, what=f"final {name}")
    return counter


def test_encoder_block_batch_and_seq():
    shapes = [(2, 8), (3, 5), (4, 11)]
    batches = [(torch.randn(b, s, 32),) for b, s in shapes]
    counter = _train_compare(EncoderBlock(), batches, loss_fn=lambda out: (out ** 2).mean())
    assert_compiles(counter, 1, training=True)


@torch.no_grad()
def test_tiny_transformer_seq_lengths():
    # pos[: s] slices a parameter by the symbolic sequence length; the causal mask is (s, s).
    # Inference only: training a transformer with symbolic sizes is test_encoder_block_batch_and_seq.
    model = TinyTransformer().eval()
    compiled, counter = compile_counted(copy.deepcopy(model))
    for b, s in ((2, 12), (3, 7), (2, 16)):
        tokens, targets = torch.randint(0, 50, (b, s)), torch.randint(0, 50, (b, s))
        run_and_compare(model, compiled, tokens, targets, rtol=1e-4, atol=1e-4, what=f"b={b} s={s}")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_symbolic_sizes_fuse_like_static_ones():
    """A dynamic compile makes the kernels a static one makes. Three things used to split them: a view
    merging (s, 32) into one dim (`(32*x + r) // (32*s)` had to simplify to `x // s` for the layer norm
    to fuse with its consumer), a view of a non-contiguous buffer (the heads of a qkv split: a copy when
    sizes were symbolic), and pos[:s] of a fixed-size parameter (Min(16, s) must settle to s under the
    guard s <= 16, or its add cannot fuse with tensors of size s). Attention stays the fused ATen op in both:
    ember's kernel for few queries (lowering/short_attention.py) covers static sizes only."""
    model = TinyTransformer().eval()
    tokens, targets = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    counts = {}
    for dynamic in (False, True):
        compiled, counter = compile_counted(copy.deepcopy(model), dynamic=dynamic)
        with ember.config.patch(short_query_attention=False):
            run_and_compare(model, compiled, tokens, targets, rtol=1e-4, atol=1e-4, what=f"dynamic={dynamic}")
        assert_compiles(counter, 1)
        counts[dynamic] = (ember.metrics.generated_kernel_count, ember.metrics.buffers_allocated)
    assert counts[True] == counts[False], f"dynamic (kernels, buffers) {counts[True]} vs static {counts[False]}"


def test_embedding_cross_entropy_batch_and_seq():
    shapes = [(8, 6), (5, 9), (13, 3), (2, 2)]
    batches = [(torch.randint(0, 40, (b, s)), torch.randint(0, 7, (b,))) for b, s in shapes]
    counter = _train_compare(Classifier(), batches)
    assert_compiles(counter, 1, training=True)


def test_cross_entropy_over_a_symbolic_number_of_classes():
    # cross-entropy's backward scatters into a [rows, classes] constant, which ember rewrites as a compare
    # with an arange over the classes: a symbolic count must enter the graph as a node, not as a raw SymInt
    # (which has no value when the graph runs; torch >= 2.13 warns about it)
    compiled, counter = compile_counted(F.cross_entropy)
    for n, classes in ((6, 10), (7, 13), (3, 29)):
        x = torch.randn(n, classes, requires_grad=True)
        target = torch.randint(0, classes, (n,))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Raw SymInt")
            loss = compiled(x, target)
            loss.backward()
        ours, x.grad = x.grad, None
        expected = F.cross_entropy(x, target)
        expected.backward()
        assert_close(loss, expected, 1e-5, 1e-6, what=f"loss {n}x{classes}")
        assert_close(ours, x.grad, 1e-5, 1e-6, what=f"grad {n}x{classes}")
    assert_compiles(counter, 1, training=True)


def _same_padding(x, k=3, stride=2, dilation=1):
    """TensorFlow's "same" padding as timm's EfficientNetV2 (tf_ variants) computes it from the image size."""
    ih, iw = x.shape[-2:]
    pad_h = max((math.ceil(ih / stride) - 1) * stride + (k - 1) * dilation + 1 - ih, 0)
    pad_w = max((math.ceil(iw / stride) - 1) * stride + (k - 1) * dilation + 1 - iw, 0)
    return F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2]).tanh()


def test_padding_sized_by_max_of_sizes():
    # max(p - s, 0) of sizes reaches ember as torch.sym_max of sympy values: sympy's Max, not a Python call
    # (which asked the expression for a number and sent the graph to eager)
    compiled, counter = compile_counted(_same_padding)
    for n in (5, 8, 9, 16):
        x = torch.randn(2, 3, n, n + 1, requires_grad=True)
        out = run_and_compare(_same_padding, compiled, x, what=f"padded {n}")
        grad = torch.randn_like(out)
        (ours,) = torch.autograd.grad(out, x, grad)
        (expected,) = torch.autograd.grad(_same_padding(x), x, grad)
        assert_close(ours, expected, what=f"grad {n}")
    assert_compiles(counter, 1, training=True)


# --- (2) odd sizes ----------------------------------------------------------------------------------------------


def _pointwise_and_reduce(x):
    y = torch.sigmoid(x) * x + 1.5
    return y, y.sum(-1), torch.softmax(x, -1)


@torch.no_grad()
def test_odd_sizes_rows():
    compiled, counter = compile_counted(_pointwise_and_reduce)
    for n in (7, 1023, 4097, 2):
        run_and_compare(_pointwise_and_reduce, compiled, torch.randn(3, n), what=f"n={n}")
    assert_compiles(counter, 1)
    # a row of length 1 is specialized by Dynamo: one more compile, and it must be right
    run_and_compare(_pointwise_and_reduce, compiled, torch.randn(3, 1), what="n=1")
    assert_compiles(counter, 2)


@torch.no_grad()
def test_odd_sizes_mark_dynamic_1d():
    def fn(x):
        return (x * 2 - 1).relu(), x.amax(), x.mean()
    compiled, counter = compile_counted(fn, dynamic=None)
    for n in (7, 1023, 4097, 3):
        x = torch.randn(n)
        torch._dynamo.mark_dynamic(x, 0)
        run_and_compare(fn, compiled, x, what=f"n={n}")
    assert_compiles(counter, 1)
    run_and_compare(fn, compiled, torch.randn(1), what="n=1")    # size 1 specializes: one more compile
    assert_compiles(counter, 2)


@torch.no_grad()
def test_odd_sizes_columns_and_batch():
    # the symbol is the outer (non-reduced) dim here, the reduced dim is static
    def fn(x, w):
        return (x @ w).sum(0), F.layer_norm(x, (x.shape[-1],))
    compiled, counter = compile_counted(fn)
    w = torch.randn(5, 6)
    for n in (7, 1023, 4097):
        run_and_compare(fn, compiled, torch.randn(n, 5), w, what=f"n={n}")
    assert_compiles(counter, 1)


# --- (3) zero-size tensors ---------------------------------------------------------------------------------------


@torch.no_grad()
def test_zero_size_input_specializes():
    def fn(x):
        return x.exp() + 1, x.sum(0), x.sum(1)
    compiled, counter = compile_counted(fn)
    for n in (4, 9):
        run_and_compare(fn, compiled, torch.randn(n, 5), what=f"n={n}")
    assert_compiles(counter, 1)
    # size 0 is specialized by Dynamo: a second compile, then reused for another empty input
    run_and_compare(fn, compiled, torch.randn(0, 5), what="n=0")
    run_and_compare(fn, compiled, torch.randn(0, 5), what="n=0 again")
    assert_compiles(counter, 2)


@torch.no_grad()
def test_zero_size_static_graph():
    # cat and constant_pad_nd load each input at a clamped index: an input with no elements along the
    # dim must not be loaded from at all (it was: "an index is out of range" in the cat/pad kernel)
    def fn(x, y):
        return (x * 2, x.sum(1), x.sum(0), x.amax(1), torch.cat([x, y]) + 1, torch.cat([y, x, y.double()]) * 2,
                F.pad(x, (1, 2, 0, 1), value=3.0) + 1, F.pad(x.t(), (1, 1)) - 1)
    compiled, counter = compile_counted(fn, dynamic=False)
    run_and_compare(fn, compiled, torch.randn(0, 4), torch.randn(3, 4))
    assert_compiles(counter, 1)


@torch.no_grad()
def test_symbolic_size_zero_at_runtime():
    # x[k:] with k = y.shape[0]: the slice's size is symbolic and is 0 (or clamped) for some inputs
    def fn(x, y):
        return x[y.shape[0]:] * 2, x[: y.shape[0]].sum(0) + y.sum()
    compiled, counter = compile_counted(fn)
    for n, k in ((9, 4), (6, 6), (5, 3), (4, 7)):
        run_and_compare(fn, compiled, torch.randn(n, 3), torch.randn(k), what=f"n={n} k={k}")
    # Dynamo itself (not ember: aot_eager recompiles the same way) guards on the slice: (n - k)*3 >= 2
    # (the is_contiguous check of a tensor of size n - k; fails at n == k, an empty slice), then
    # k <= n (the clamped slice at n=4, k=7). So three graphs, each compiled once.
    assert_compiles(counter, 3)


# --- (4) broadcasting with symbolic dims ------------------------------------------------------------------------


@torch.no_grad()
def test_broadcast_symbolic_dims():
    def fn(a, b, c):
        # a: (s0, 1, s2), b: (s1, 1), c: (s2,)  -> (s0, s1, s2)
        out = a + b * c
        return out, out.sum(1), (a * c).mean(-1)
    compiled, counter = compile_counted(fn)
    for s0, s1, s2 in ((2, 3, 4), (5, 7, 3), (3, 2, 9), (4, 4, 4)):
        run_and_compare(fn, compiled, torch.randn(s0, 1, s2), torch.randn(s1, 1), torch.randn(s2),
                        what=f"{s0, s1, s2}")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_broadcast_expand_and_outer():
    def fn(x, y):
        # outer product of two symbolic vectors, and an explicit expand to a symbolic size
        return x[:, None] * y[None, :], x.unsqueeze(1).expand(x.shape[0], y.shape[0]) - y
    compiled, counter = compile_counted(fn)
    for n, m in ((3, 5), (8, 2), (17, 11)):
        run_and_compare(fn, compiled, torch.randn(n), torch.randn(m), what=f"{n}x{m}")
    assert_compiles(counter, 1)


def test_broadcast_symbolic_grad():
    # the backward of a broadcast is a reduction over the symbolic broadcast dims
    def fn(a, b):
        return (a * b).tanh().sum()
    compiled, counter = compile_counted(fn)
    for n, m in ((3, 4), (6, 5), (2, 9)):
        a, b = torch.randn(n, 1, requires_grad=True), torch.randn(m, requires_grad=True)
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        out_e, out_c = fn(a, b), compiled(a2, b2)
        assert_close(out_c, out_e)
        out_e.backward()
        out_c.backward()
        assert_close([a2.grad, b2.grad], [a.grad, b.grad], what=f"grad {n}x{m}")
    assert_compiles(counter, 1, training=True)


# --- (5) a training loop with a varying batch size --------------------------------------------------------------


def test_training_loop_varying_batch():
    torch.manual_seed(0)
    model = MLP()
    ours = copy.deepcopy(model)
    compiled, counter = compile_counted(ours)
    opt_e = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(ours.parameters(), lr=0.1)
    losses_e, losses_c = [], []
    for step, b in enumerate((4, 9, 6, 13, 5)):
        x, t = torch.randn(b, 32), torch.randint(0, 10, (b,))
        loss_e, loss_c = model(x, t), compiled(x, t)
        losses_e.append(loss_e.item())
        losses_c.append(loss_c.item())
        loss_e.backward()
        loss_c.backward()
        for (name, pe), pc in zip(model.named_parameters(), ours.parameters()):
            assert_close(pc.grad, pe.grad, 1e-4, 1e-5, what=f"step {step} (batch {b}) grad of {name}")
        opt_e.step()
        opt_c.step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    assert_close(torch.tensor(losses_c), torch.tensor(losses_e), 1e-4, 1e-5, what="losses")
    for (name, pe), pc in zip(model.named_parameters(), ours.parameters()):
        assert_close(pc, pe, 1e-4, 1e-5, what=f"final {name}")
    assert_compiles(counter, 1, training=True)


# --- (6) reductions over a symbolic row length ------------------------------------------------------------------


def _row_reductions(x):
    return (x.sum(-1), x.amax(-1), torch.softmax(x, -1), torch.log_softmax(x, -1),
            torch.var_mean(x, -1), F.layer_norm(x, (x.shape[-1],)), x.argmax(-1))


@pytest.mark.parametrize("persistent_max", [64, 16384])
@torch.no_grad()
def test_row_reductions_symbolic_length(persistent_max):
    # with a symbolic row length the persistent (whole row held) vs looped choice must be valid for every
    # length, or guarded. Lengths straddle the limit; the first is above it, so the choice (looped) needs
    # no guard: one compile. A first length below the limit guards it (tests/codegen/test_dynamic_reductions.py).
    with ember.config.patch(persistent_reduction_max=persistent_max):
        compiled, counter = compile_counted(_row_reductions)
        for n in (1023, 7, 4097, 63, 65, 2):
            run_and_compare(_row_reductions, compiled, torch.randn(3, n), rtol=1e-4, atol=1e-4, what=f"n={n}")
    assert_compiles(counter, 1)


def test_row_reductions_symbolic_length_grad():
    def fn(x):
        return (torch.softmax(x, -1) * F.layer_norm(x, (x.shape[-1],))).sum()
    compiled, counter = compile_counted(fn)
    for rows, n in ((3, 7), (2, 1023), (4, 130)):
        x = torch.randn(rows, n, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out_e, out_c = fn(x), compiled(x2)
        assert_close(out_c, out_e, 1e-4, 1e-4)
        out_e.backward()
        out_c.backward()
        assert_close(x2.grad, x.grad, 1e-4, 1e-4, what=f"grad n={n}")
    assert_compiles(counter, 1, training=True)


@torch.no_grad()
def test_full_reduction_symbolic_numel():
    def fn(x):
        return x.sum(), x.amax(), x.mean(), (x * x).sum().sqrt()
    compiled, counter = compile_counted(fn)
    for shape in ((3, 7), (31, 33), (2, 4097), (5, 2)):
        run_and_compare(fn, compiled, torch.randn(*shape), rtol=1e-4, atol=1e-4, what=f"{shape}")
    assert_compiles(counter, 1)


# --- (7) data-dependent sizes -------------------------------------------------------------------------------------


@torch.no_grad()
def test_boolean_mask_indexing():
    def fn(x):
        y = x[x > 0]
        return y * 2, y.sum()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled, counter = compile_counted(fn)
        for n in (5, 33, 100, 8):
            run_and_compare(fn, compiled, torch.randn(n, 3), rtol=1e-4, atol=1e-4, what=f"n={n}")
        run_and_compare(fn, compiled, -torch.rand(6, 3), what="nothing selected")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_nonzero():
    def fn(x):
        idx = torch.nonzero(x > 0.5)
        return idx, idx.shape[0] * 1.0 + x.sum()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled, counter = compile_counted(fn)
        for n in (4, 17, 50):
            run_and_compare(fn, compiled, torch.rand(n, 2), rtol=1e-5, atol=1e-5, what=f"n={n}")
        run_and_compare(fn, compiled, torch.zeros(3, 2), what="no nonzero")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_nonzero_then_compute():
    # the unbacked size feeds further kernels: gather rows of x at the nonzero positions and reduce them
    def fn(x, m):
        rows = torch.nonzero(m).squeeze(1)
        g = x[rows]
        return torch.softmax(g, -1), g.sum(0)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled, counter = compile_counted(fn)
        for n in (6, 20, 9):
            m = torch.rand(n) > 0.4
            m[0] = True
            run_and_compare(fn, compiled, torch.randn(n, 4), m, rtol=1e-4, atol=1e-5, what=f"n={n}")
    assert_compiles(counter, 1)


# --- (8) slice and select bounds counted from the end ---------------------------------------------------------


@torch.no_grad()
def test_slice_from_the_end_by_a_symbolic_length():
    # T5's attention: position_bias[:, :, -seq_length:, :], where Dynamo passes the start as -s0
    def fn(bias, h):
        n = h.shape[1]
        return bias[:, :, -n:, :] * 2 + 1, bias[:, :, :-n + 1].sum(-1)
    compiled, counter = compile_counted(fn)
    for n in (16, 23, 37):
        run_and_compare(fn, compiled, torch.randn(1, 4, n, n), torch.randn(2, n, 8), what=f"n={n}")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_slice_from_the_end_longer_than_the_dim():
    # -k with k > the dim's size clamps to 0: x[-k:] is all of x
    def fn(x, y):
        return x[-y.shape[0]:] * 3
    compiled, _ = compile_counted(fn)
    for n, k in ((4, 9), (6, 11), (5, 3)):
        run_and_compare(fn, compiled, torch.randn(n, 3), torch.randn(k), what=f"n={n}, k={k}")


@torch.no_grad()
def test_select_from_the_end_by_a_symbolic_index():
    def fn(x, h):
        return x.select(1, -h.shape[0]) * 2
    compiled, counter = compile_counted(fn)
    for n, k in ((8, 3), (12, 5), (9, 9)):
        run_and_compare(fn, compiled, torch.randn(2, n), torch.randn(k), what=f"n={n}, k={k}")


@torch.no_grad()
def test_slice_by_a_constant_past_a_symbolic_dim():
    # x[:, :12] of a dim of symbolic size: 12 or all of a shorter dim
    def fn(x):
        return x[:, :12] + 1
    compiled, _ = compile_counted(fn)
    for n in (5, 20, 7, 30):
        run_and_compare(fn, compiled, torch.randn(3, n), what=f"n={n}")


@torch.no_grad()
def test_as_strided_of_a_computed_value_with_a_symbolic_batch():
    # Swin's pooled features: as_strided(mean, (b, 64, 1, 1), (64, 1, 64, 64)) compiles for every batch size
    lin = nn.Linear(7, 64)

    def fn(x):
        m = lin(x).mean(1)
        return torch.as_strided(m, (m.shape[0], 64, 1, 1), (64, 1, 64, 64)) * 2
    compiled, counter = compile_counted(fn)
    for b in (3, 5, 8):
        run_and_compare(fn, compiled, torch.randn(b, 5, 7), rtol=1e-5, atol=1e-6, what=f"b={b}")
    assert_compiles(counter, 1)


@torch.no_grad()
def test_as_strided_past_what_the_sizes_promise_stays_right():
    # the view's last element is within the value only where s1 >= 64, which no guard says: run eagerly
    def fn(x):
        m = x.mean(-1)
        return torch.as_strided(m, (m.shape[0], 64), (64, 1)) * 2
    compiled, _ = compile_counted(fn)
    with ember.config.patch(fallback_on_error=True), pytest.warns(RuntimeWarning, match="as_strided"):
        run_and_compare(fn, compiled, torch.randn(3, 64, 5), rtol=1e-5, atol=1e-6)
    assert ember.metrics.eager_fallbacks == 1


# --- (9) sizes that are quotients of symbolic sizes -------------------------------------------------------------


def _eval_in_one_graph(model_class, shapes):
    """The model in eval mode on random inputs of each shape: eager's outputs, from one compiled graph."""
    torch.manual_seed(0)
    model = model_class().eval()
    compiled, counter = compile_counted(copy.deepcopy(model))
    for shape in shapes:
        run_and_compare(model, compiled, torch.randn(shape), rtol=1e-4, atol=1e-5, what=f"input {shape}")
    assert_compiles(counter, 1)


def _windows(x, w):
    B, H, W, C = x.shape
    return x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, C)


class _SwinStage(nn.Module):
    """Swin's shapes: a strided patch embedding (sizes s // 4), windows of a padded, shifted map
    (view(B, H // w, w, W // w, w, C) and back) with the shifted windows' mask broadcast over the batch
    (scores.view(windows // n, n, ...)), and patch merging (x[:, 0::2, 0::2] ..., (H + 1) // 2)."""

    def __init__(self, c=8, window=4):
        super().__init__()
        self.window, self.shift = window, window // 2
        self.patch = nn.Conv2d(3, c, 4, stride=4)
        self.norm = nn.LayerNorm(c)
        self.mix = nn.Linear(c, c)
        self.merge = nn.Linear(4 * c, 2 * c)

    def forward(self, x):
        x = self.patch(x)
        B, C, H, W = x.shape
        x = self.norm(x.flatten(2).transpose(1, 2)).view(B, H, W, C)
        w = self.window
        x = F.pad(x, (0, 0, 0, (w - W % w) % w, 0, (w - H % w) % w))
        Hp, Wp = x.shape[1], x.shape[2]
        x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = _windows(x, w)
        # the shifted windows' mask: which region of the map each position came from, per window
        regions = (torch.arange(Hp, device=x.device)[:, None] >= Hp - w) * 2 + (torch.arange(Wp, device=x.device) >= Wp - w)
        regions = _windows(regions[None, :, :, None].float(), w)[..., 0]
        mask = (regions[:, None, :] != regions[:, :, None]).float() * -100.0
        n = mask.shape[0]
        scores = (self.mix(win) @ win.transpose(1, 2)).view(win.shape[0] // n, n, w * w, w * w) + mask[None]
        win = win + torch.softmax(scores, -1).view(-1, w * w, w * w) @ win
        x = win.view(-1, Hp // w, Wp // w, w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
        x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))[:, :H, :W, :]
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        h2, w2 = (H + 1) // 2, (W + 1) // 2
        x = self.merge(x.view(B, -1, 4 * C)).view(B, h2, w2, 2 * C)
        return x, x.mean((1, 2))


@torch.no_grad()
def test_swin_windows_and_patch_merging_halve_symbolic_sizes():
    # (H + 1) // 2 of H = s // 4 reached the index printer as floor(floor(s/4)/2 + 1/2): "index 1/2 is
    # not an integer", and the graph ran eagerly. Sizes enter ember as its own integer FloorDiv.
    # H = hw // 4 is 2 mod 4 in each: a window padding of 0 (hw = 32) is a specialization Dynamo recompiles for
    _eval_in_one_graph(_SwinStage, [(b, 3, hw, hw) for b, hw in ((2, 40), (3, 56), (2, 72))])


class _ConvFeatures(nn.Module):
    """wav2vec2's feature extractor: strided convolutions give T = floor((L - 10) / 5) + 1, then
    floor((T - 3) / 2) + 1 frames; the frames are normalized and reshaped by sizes the graph computes."""

    def __init__(self, c=16):
        super().__init__()
        self.conv0 = nn.Conv1d(1, c, 10, stride=5)
        self.conv1 = nn.Conv1d(c, c, 3, stride=2)
        self.norm = nn.LayerNorm(c)
        self.proj = nn.Linear(c, c)

    def forward(self, audio):
        x = self.conv1(F.gelu(self.conv0(audio[:, None]))).transpose(1, 2)
        B, T, C = x.shape
        y = self.norm(x).reshape(B * T, C)
        y = self.proj(y).view(B, T, C)
        return self.norm(y + x), y.view(B, T * C).softmax(-1)


@torch.no_grad()
def test_conv_feature_lengths_index_like_the_sizes_they_equal():
    # torch writes T as (L // 10) - 1 in the graph's size arithmetic, and ember wrote L // 10 as sympy's
    # floor(L/10) beside its own FloorDiv(L, 10) in one index: the C++ kernel took a float modulus
    _eval_in_one_graph(_ConvFeatures, [(2, 1600), (3, 2300), (2, 3705)])


class _PatchUnfold(nn.Module):
    """MobileViT's block: a strided convolution (H = ceil(s / 2)), the map cut into 2x2 patches by reshapes
    and transposes over ceil(H / 2) patches a side (a token per patch position, [B * 4, patches, C]),
    a residual linear layer and a norm over the tokens, then folded back and projected."""

    def __init__(self, c=8, d=12):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, stride=2, padding=1)
        self.proj = nn.Conv2d(c, d, 1)
        self.mix = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.back = nn.Conv2d(d, c, 1)

    def forward(self, x):
        x = self.proj(self.conv(x))
        B, C, H, W = x.shape
        nh, nw = math.ceil(H / 2), math.ceil(W / 2)
        if 2 * nh != H or 2 * nw != W:
            x = F.interpolate(x, size=(2 * nh, 2 * nw), mode="bilinear", align_corners=False)
        x = x.reshape(B * C * nh, 2, nw, 2).transpose(1, 2)
        x = x.reshape(B, C, nh * nw, 4).transpose(1, 3).reshape(B * 4, nh * nw, -1)
        x = self.norm(x + self.mix(x))
        x = x.contiguous().view(B, 4, nh * nw, -1).transpose(1, 3).reshape(B * C * nh, nw, 2, 2)
        x = x.transpose(1, 2).reshape(B, C, 2 * nh, 2 * nw)
        return self.back(x).tanh()


def test_patch_unfolding_trains_under_symbolic_sizes():
    # the unfolded indices nest floors of sizes written both as 4*FloorDiv(s - 1, 4) + 4 and 4*(FloorDiv(..) + 1):
    # their divisibility is read factor by factor, so the compile takes seconds, where cancelling every
    # floor as a polynomial took minutes
    torch.manual_seed(0)
    model = _PatchUnfold()
    compiled, counter = compile_counted(copy.deepcopy(model))
    for shape in ((2, 3, 8, 12), (3, 3, 12, 16)):
        x = torch.randn(shape)
        out = run_and_compare(model, compiled, x, rtol=1e-4, atol=1e-5, what=f"input {shape}")
        grad = torch.randn_like(out)
        expected = torch.autograd.grad(model(x), list(model.parameters()), grad)
        got = torch.autograd.grad(compiled(x), list(compiled.parameters()), grad)
        for name, a, b in zip([n for n, _ in model.named_parameters()], got, expected):
            assert_close(a, b, 1e-4, 1e-5, what=f"grad of {name}, input {shape}")
    assert_compiles(counter, 1, training=True)


_SOURCE_OF_A_SYMBOLIC_GRAPH = r"""
import torch, torch.nn.functional as F, ember
from torch.fx.experimental.proxy_tensor import make_fx
def f(x, y):
    return (F.pad(x, (1, 2, 3, 4)).tanh() + y.sum()).permute(3, 1, 0, 2) * 2
args = [torch.randn(2, 3, 4, 5), torch.randn(6, 7)]
compiled = ember.compile_graph(make_fx(f, tracing_mode="symbolic")(*args), args)
out = compiled(list(args))[0]
torch.testing.assert_close(out, f(*args))
print(compiled.source)
"""


def test_a_symbolic_graph_compiles_to_the_same_source_in_every_process(tmp_path):
    """Kernels take size symbols as arguments in name order, not a set's: the order of a set of symbols
    follows their names' hashes, which Python draws per process, and the same graph's kernels then
    differed from one process to the next (new C++ compiles, new cache entries)."""
    import os
    import subprocess
    import sys
    sources = set()
    for seed in ("1", "2", "3", "4"):
        env = dict(os.environ, PYTHONHASHSEED=seed, EMBER_CACHE_DIR=str(tmp_path / seed), EMBER_GRAPH_CACHE="0")
        out = subprocess.run([sys.executable, "-c", _SOURCE_OF_A_SYMBOLIC_GRAPH], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        sources.add(out.stdout)
    assert len(sources) == 1
