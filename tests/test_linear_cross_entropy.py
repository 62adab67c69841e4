"""cross_entropy(linear(x, W, b), target) is rewritten to ember::linear_cross_entropy (graph/passes/
linear_cross_entropy.py), which computes the loss and the gradients of x, W and b in chunks of rows: the
compiled loss and gradients match eager's, and no graph ember compiles holds a [tokens, vocab] value for the
loss."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import fresh_compile

N, H, V = 26, 16, 53          # V prime: no chunk of rows or block of columns divides it
CHUNK_ROWS = 5                # float32: 26 rows -> chunks of 5 rows and one of 1; bfloat16: of 6 and one of 2


@pytest.fixture(autouse=True)
def _rewrite_on():
    with ember.config.patch(fused_linear_cross_entropy=True):
        yield


@pytest.fixture
def graphs():
    """Every graph ember lowers (after its post-grad passes), as its nodes; chunks of CHUNK_ROWS rows."""
    seen = []
    with ember.config.patch(post_grad_passes=[lambda gm: seen.append(list(gm.graph.nodes))],
                            linear_cross_entropy_chunk_bytes=CHUNK_ROWS * V * 8):
        yield seen


def logits_sized(graphs, rows: int = N) -> list:
    """The targets of the nodes (placeholders by name) whose value has rows x V elements or more."""
    out = []
    for g in graphs:
        for n in g:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.numel() >= rows * V:
                out.append(n.name if n.op == "placeholder" else n.target)
    return out


def assert_rewritten(graphs, count: int = 1):
    assert ember.metrics.linear_cross_entropy_rewrites == count
    calls = [n for g in graphs for n in g if n.target is torch.ops.ember.linear_cross_entropy.default]
    assert len(calls) == count
    assert logits_sized(graphs) == [], "a [tokens, vocab] value is left in a compiled graph"


def close(actual, expected, dtype, what):
    """Within the dtype's tolerance, relative to the largest value (gradients of a mean are small)."""
    rtol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    scale = expected.detach().float().abs().max().item()
    torch.testing.assert_close(actual.detach().float(), expected.detach().float(), rtol=rtol, atol=rtol * scale,
                               msg=lambda m: f"{what}: {m}")


def inputs(bias: bool, ignored: bool, rows: int = N):
    x = torch.randn(rows, H)
    w = torch.randn(V, H) * 0.5
    b = torch.randn(V) if bias else None
    t = torch.randint(0, V, (rows,))
    if ignored:
        t[torch.rand(rows) < 0.3] = -100
    return x, w, b, t


def run_both(fn, tensors, dtype, grad: bool = True):
    """fn(*tensors) eagerly and compiled, under autocast for bf16: (eager, compiled) outputs and the
    gradients of the floating tensors (grad of the first output, a loss)."""
    results = []
    for run in (fn, fresh_compile(fn)):
        leaves = [t.detach().clone().requires_grad_(grad and t.is_floating_point()) if t is not None else None
                  for t in tensors]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            out = run(*leaves)
        if grad:
            (out[0] if isinstance(out, tuple) else out).backward()
        grads = [t.grad for t in leaves if t is not None and t.is_floating_point()] if grad else []
        results.append((out, grads))
    return results


def compare(results, dtype):
    (eager, eager_grads), (compiled, compiled_grads) = results
    eager, compiled = (eager if isinstance(eager, tuple) else (eager,)), (compiled if isinstance(compiled, tuple) else (compiled,))
    for i, (a, e) in enumerate(zip(compiled, eager)):
        assert a.dtype == e.dtype and a.shape == e.shape, f"output {i}"
        close(a, e, dtype, f"output {i}")
    assert len(compiled_grads) == len(eager_grads)
    for i, (a, e) in enumerate(zip(compiled_grads, eager_grads)):
        assert a is not None, f"grad {i} missing"
        close(a, e, dtype, f"grad {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("ignored", [False, True])
def test_linear_then_cross_entropy(dtype, reduction, bias, ignored, graphs):
    def fn(x, w, b, t):
        return F.cross_entropy(F.linear(x, w, b), t, reduction=reduction)

    compare(run_both(fn, inputs(bias, ignored), dtype), dtype)
    assert_rewritten(graphs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothing_and_other_ignore_index(dtype, graphs):
    def fn(x, w, t):
        return F.cross_entropy(F.linear(x, w), t, ignore_index=3, label_smoothing=0.1)

    x, w, _, t = inputs(False, False)
    t[::4] = 3
    compare(run_both(fn, (x, w, t), dtype), dtype)
    assert_rewritten(graphs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["method", "function"])
def test_flattened_batch_and_sequence(dtype, form, graphs):
    """A head over [batch, seq, H] whose logits are flattened to rows (torchtitan's and many training
    scripts' loss): the flatten keeps the vocabulary dim, so the rows are x's rows in order."""
    def fn(h, w, t):
        logits = F.linear(F.layer_norm(h, (H,)), w)
        rows = logits.flatten(0, 1) if form == "method" else torch.flatten(logits, 0, 1)
        return F.cross_entropy(rows.float(), t.flatten())

    x, w, _, t = inputs(False, True)
    compare(run_both(fn, (x.view(2, N // 2, H), w, t.view(2, N // 2)), dtype), dtype)
    assert_rewritten(graphs)


class CausalLMHead(torch.nn.Module):
    """What a Hugging Face causal LM computes from its last hidden states when given labels."""

    def __init__(self, return_logits: bool, reduction: str):
        super().__init__()
        self.lm_head = torch.nn.Linear(H, V, bias=False)
        self.return_logits, self.reduction = return_logits, reduction

    def forward(self, h, labels, num_items=None):
        logits = self.lm_head(h)
        upcast = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)
        shift_labels = labels[..., 1:].contiguous()
        loss = F.cross_entropy(upcast.view(-1, V), shift_labels.view(-1).to(upcast.device), ignore_index=-100,
                               reduction=self.reduction)
        if num_items is not None:
            loss = loss / num_items
        return (loss, logits) if self.return_logits else loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("return_logits", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_hugging_face_shifted_loss(dtype, return_logits, reduction, graphs):
    head = CausalLMHead(return_logits, reduction)
    B, T = 2, N // 2
    h, labels = torch.randn(B, T, H), torch.randint(0, V, (B, T))
    labels[0, :3] = -100
    num_items = (labels != -100).sum() if reduction == "sum" else None

    def step(compiled: bool):
        torch._dynamo.reset()
        model = torch.compile(head, backend="ember") if compiled else head
        x = h.clone().requires_grad_(True)
        head.lm_head.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            out = model(x, labels, num_items)
        (out[0] if return_logits else out).backward()
        return out, [x.grad, head.lm_head.weight.grad.clone()]

    compare([step(False), step(True)], dtype)
    assert ember.metrics.linear_cross_entropy_rewrites == 1
    if return_logits:
        # the returned logits' product stays, and nothing else of their size: no fp32 copy, no softmax;
        # the op reads its rows from them, and the backward has nothing of their size (no zero gradient)
        forward, backward = graphs
        targets = logits_sized([forward])
        logits_ops = {torch.ops.aten.mm.default, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                      torch.ops.aten.permute.default, torch.ops.aten.alias.default, "output"}
        assert targets and set(t for t in targets if not isinstance(t, str) or t == "output") <= logits_ops, targets
        (call,) = [n for n in forward if n.target is torch.ops.ember.linear_cross_entropy.default]
        assert len(call.args) == 14, "the op multiplies again instead of reading the logits"
        assert logits_sized([backward]) == []
    else:
        assert_rewritten(graphs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_returned_logits_keep_their_gradient(dtype, bias, graphs):
    """Logits returned beside the fused loss and then used by the program (a second loss on them, an
    in-place scale) give eager's gradients of x, W and b: their backward runs outside the graph."""
    def fn(x, w, b, t):
        logits = F.linear(x, w, b)
        return F.cross_entropy(logits.float(), t), logits

    results, tensors = [], inputs(bias, True)
    for run in (fn, fresh_compile(fn)):
        leaves = [v.detach().clone().requires_grad_(v.is_floating_point()) if v is not None else None
                  for v in tensors]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            loss, logits = run(*leaves)
        logits.mul_(0.5)
        (loss + logits.float().pow(2).mean()).backward()
        results.append(((loss, logits), [v.grad for v in leaves if v is not None and v.is_floating_point()]))
    compare(results, dtype)
    assert ember.metrics.linear_cross_entropy_rewrites == ember.metrics.deferred_head_logits == 1
    scaled = results[1][0][1].grad_fn
    assert type(scaled.next_functions[0][0]).__name__ == "HeadLogitsBackward"


def test_older_shift_of_the_logits(graphs):
    """`logits[..., :-1, :]` with `labels[..., 1:]`: the row slice applies to x."""
    def fn(h, w, labels):
        logits = F.linear(h, w)
        shift_logits = logits[..., :-1, :].contiguous()
        return F.cross_entropy(shift_logits.view(-1, V), labels[..., 1:].contiguous().view(-1))

    compare(run_both(fn, (torch.randn(2, N // 2, H), torch.randn(V, H), torch.randint(0, V, (2, N // 2))),
                     torch.float32), torch.float32)
    assert ember.metrics.linear_cross_entropy_rewrites == 1
    assert logits_sized(graphs, rows=N - 2) == []


def test_inference_computes_the_loss_alone(graphs):
    def fn(x, w, t):
        return F.cross_entropy(F.linear(x, w), t, ignore_index=-100)

    x, w, _, t = inputs(False, True)
    with torch.no_grad():
        compare(run_both(fn, (x, w, t), torch.float32, grad=False), torch.float32)
    assert_rewritten(graphs)
    (call,) = [n for g in graphs for n in g if n.target is torch.ops.ember.linear_cross_entropy.default]
    assert call.args[-3:] == (False, False, False)


def test_only_the_weight_needs_a_gradient(graphs):
    def fn(x, w, t):
        return F.cross_entropy(F.linear(x.detach(), w), t)

    x, w, _, t = inputs(False, False)
    w_eager, w_ember = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = fn(x, w_eager, t)
    expected.backward()
    actual = fresh_compile(fn)(x, w_ember, t)
    actual.backward()
    close(actual, expected, torch.float32, "loss")
    close(w_ember.grad, w_eager.grad, torch.float32, "grad of w")
    (call,) = [n for g in graphs for n in g if n.target is torch.ops.ember.linear_cross_entropy.default]
    assert call.args[-3:] == (False, True, False)


def test_dynamic_rows(graphs):
    def fn(x, w, t):
        return F.cross_entropy(F.linear(x, w), t, ignore_index=-100)

    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for rows in (N, N + 7):
        x, w, _, t = inputs(False, True, rows)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        expected, actual = fn(xs[0], w, t), compiled(xs[1], w, t)
        expected.backward()
        actual.backward()
        close(actual, expected, torch.float32, "loss")
        close(xs[1].grad, xs[0].grad, torch.float32, "grad of x")
    assert ember.metrics.linear_cross_entropy_rewrites >= 1
    assert logits_sized(graphs, rows=N) == []


def test_dynamic_rows_with_returned_logits(graphs):
    """Returned logits over a dynamic number of rows: their backward outside the graph, eager's gradients
    at every size."""
    def fn(x, w, t):
        logits = F.linear(x, w)
        return F.cross_entropy(logits, t, ignore_index=-100), logits

    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for rows in (N, N + 7):
        x, w, _, t = inputs(False, True, rows)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        ws = [w.clone().requires_grad_(True) for _ in range(2)]
        for run, xi, wi in ((fn, xs[0], ws[0]), (compiled, xs[1], ws[1])):
            loss, logits = run(xi, wi, t)
            (loss + logits.sin().mean()).backward()
        close(xs[1].grad, xs[0].grad, torch.float32, "grad of x")
        close(ws[1].grad, ws[0].grad, torch.float32, "grad of w")
    assert ember.metrics.deferred_head_logits >= 1


def test_switched_off():
    def fn(x, w, t):
        return F.cross_entropy(F.linear(x, w), t)

    x, w, _, t = inputs(False, False)
    with ember.config.patch(fused_linear_cross_entropy=False):
        compare(run_both(fn, (x, w, t), torch.float32), torch.float32)
    assert ember.metrics.linear_cross_entropy_rewrites == 0


@pytest.mark.parametrize("case", ["class_weights", "probabilities", "no_linear", "sliced_vocab"])
def test_other_forms_are_left_alone(case, graphs):
    x, w, _, t = inputs(False, False)
    class_weights = torch.rand(V) + 0.5
    probabilities = torch.softmax(torch.randn(N, V), -1)
    fns = {
        "class_weights": lambda x, w, t: F.cross_entropy(F.linear(x, w), t, weight=class_weights),
        "probabilities": lambda x, w, t: F.cross_entropy(F.linear(x, w), probabilities),
        "no_linear": lambda x, w, t: F.cross_entropy(torch.tanh(F.linear(x, w)), t),
        "sliced_vocab": lambda x, w, t: F.cross_entropy(F.linear(x, w)[:, : V - 3], t.clamp(max=V - 4)),
    }
    compare(run_both(fns[case], (x, w, t), torch.float32), torch.float32)
    assert ember.metrics.linear_cross_entropy_rewrites == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_op_with_a_padded_vocabulary(dtype, label_smoothing):
    """vocab_align pads W's rows (and b) to a multiple of 8; the padding takes no part in the loss or the
    gradients (called directly: the C++ backend's alignment never pads)."""
    _check_the_op(dtype, label_smoothing, vocab_align=8)


def _check_the_op(dtype, label_smoothing, vocab_align):
    """The op called directly (mean over rows not ignored, with gradients) against eager's cross-entropy of
    the linear layer: loss and the gradients of x, W and b; -> the inputs."""
    x, w, b, t = inputs(True, True)
    x, w, b = (v.to(dtype).requires_grad_(True) for v in (x, w, b))
    expected = F.cross_entropy(F.linear(x, w, b).float(), t, label_smoothing=label_smoothing)
    expected.backward()
    grads = [v.grad for v in (x, w, b)]
    for v in (x, w, b):
        v.grad = None
    actual = torch.ops.ember.linear_cross_entropy(x, w, b, t, -100, "mean", label_smoothing, CHUNK_ROWS,
                                                  vocab_align, torch.float32, True, True, True)[0]
    actual.backward()
    close(actual, expected, dtype, "loss")
    for i, (v, g) in enumerate(zip((x, w, b), grads)):
        close(v.grad, g, dtype, f"grad {i}")
    return x, w, b, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_align", [1, 8])
def test_the_op_reads_given_logits(dtype, vocab_align):
    _check_the_op_with_logits(dtype, vocab_align)


def _check_the_op_with_logits(dtype, vocab_align):
    """Logits handed to the op (a strided view of the rows, as a shifted head's) give the loss and
    gradients of the product's, and are left as they were."""
    x, w, b, t = inputs(True, True, rows=2 * N)
    x, w, b = (v.to(dtype).requires_grad_(True) for v in (x, w, b))
    logits = F.linear(x, w, b).detach()[::2]
    before = logits.clone()
    x_rows = x[::2]
    expected = F.cross_entropy(F.linear(x_rows, w, b).float(), t[::2], label_smoothing=0.1)
    grads = torch.autograd.grad(expected, (x, w, b))
    actual = torch.ops.ember.linear_cross_entropy(x_rows, w, b, t[::2], -100, "mean", 0.1, CHUNK_ROWS,
                                                  vocab_align, torch.float32, True, True, True, logits)[0]
    close(actual, expected, dtype, "loss")
    for i, (a, e) in enumerate(zip(torch.autograd.grad(actual, (x, w, b)), grads)):
        close(a, e, dtype, f"grad {i}")
    assert torch.equal(logits, before)


@pytest.fixture
def row_kernel(monkeypatch):
    """The op's chunks through runtime/cross_entropy_rows.py's Triton kernel (on CUDA), here run by Triton's
    interpreter on the CPU, with blocks of 16 columns so that each row takes several."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():       # Triton 3.6's interpreter fails on loops of a runtime length there
        pytest.skip("the CUDA tests below run the kernels on the GPU")
    from ember.runtime import cross_entropy_rows
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(cross_entropy_rows, "usable", lambda x: True)
    monkeypatch.setattr(cross_entropy_rows, "BLOCK", 16)
    cross_entropy_rows._kernel.cache_clear()
    calls = []
    launch = cross_entropy_rows.loss_and_grad
    monkeypatch.setattr(cross_entropy_rows, "loss_and_grad", lambda *a, **k: calls.append(a) or launch(*a, **k))
    yield calls
    cross_entropy_rows._kernel.cache_clear()       # built for the interpreter: not for a later GPU test


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("vocab_align", [1, 8])
def test_the_row_kernel_gives_the_loss_and_gradients(row_kernel, dtype, label_smoothing, vocab_align):
    """Loss and gradients through the chunk kernel match eager's cross-entropy of the linear layer, with
    ignored rows, label smoothing and a padded vocabulary; the loss alone (no gradients wanted) too."""
    x, w, b, t = _check_the_op(dtype, label_smoothing, vocab_align)
    assert len(row_kernel) == -(-N // CHUNK_ROWS)
    loss_only = torch.ops.ember.linear_cross_entropy(x.detach(), w.detach(), b.detach(), t, -100, "sum",
                                                     label_smoothing, CHUNK_ROWS, vocab_align, torch.float32,
                                                     False, False, False)[0]
    summed = F.cross_entropy(F.linear(x, w, b).float(), t, label_smoothing=label_smoothing, reduction="sum")
    close(loss_only, summed, dtype, "loss alone")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_align", [1, 8])
def test_the_row_kernel_reads_given_logits(row_kernel, dtype, vocab_align, monkeypatch):
    """With the logits given, the kernels take chunks of columns: one pass for the rows' statistics, then
    the gradient of 16 columns at a time (V = 53: four chunks, the last of 5 columns)."""
    from ember.runtime import cross_entropy_rows
    chunks = []
    launch = cross_entropy_rows.columns_grad
    monkeypatch.setattr(cross_entropy_rows, "columns_grad", lambda *a: chunks.append(a) or launch(*a))
    _check_the_op_with_logits(dtype, vocab_align)
    assert len(row_kernel) == 1 and [a[4].shape[1] for a in chunks] == [16, 16, 16, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the chunk kernel runs on CUDA")
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_the_row_kernel_on_cuda(label_smoothing):
    """GPT-2's vocabulary (50257, padded to 50264), bf16, rows in chunks of 96, blocks of 4096 columns: the
    op's loss and gradients on CUDA against eager's cross-entropy of the linear layer in fp32."""
    torch.manual_seed(0)
    rows, hidden, vocab = 300, 64, 50257
    x = torch.randn(rows, hidden, device="cuda")
    w = torch.randn(vocab, hidden, device="cuda") * 0.2
    t = torch.randint(0, vocab, (rows,), device="cuda")
    t[torch.rand(rows, device="cuda") < 0.2] = -100
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = F.cross_entropy(F.linear(xr.bfloat16().float(), wr.bfloat16().float()), t,
                               label_smoothing=label_smoothing)
    expected.backward()
    xb, wb = x.bfloat16().requires_grad_(True), w.bfloat16().requires_grad_(True)
    actual = torch.ops.ember.linear_cross_entropy(xb, wb, None, t, -100, "mean", label_smoothing, 96, 8,
                                                  torch.float32, True, True, False)[0]
    actual.backward()
    close(actual, expected, torch.bfloat16, "loss")
    close(xb.grad, xr.grad, torch.bfloat16, "grad x")
    close(wb.grad, wr.grad, torch.bfloat16, "grad W")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the chunk kernels run on CUDA")
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_given_logits_on_cuda(label_smoothing):
    """The op with the logits given (chunks of columns), GPT-2's vocabulary, bf16, with a bias: loss and
    gradients of x, W and b against eager's cross-entropy of the linear layer in fp32."""
    torch.manual_seed(0)
    rows, hidden, vocab = 300, 64, 50257
    x = torch.randn(rows, hidden, device="cuda")
    w = torch.randn(vocab, hidden, device="cuda") * 0.2
    b = torch.randn(vocab, device="cuda")
    t = torch.randint(0, vocab, (rows,), device="cuda")
    t[torch.rand(rows, device="cuda") < 0.2] = -100
    ref = [v.bfloat16().float().requires_grad_(True) for v in (x, w, b)]
    expected = F.cross_entropy(F.linear(*ref), t, label_smoothing=label_smoothing)
    expected.backward()
    xb, wb, bb = (v.bfloat16().requires_grad_(True) for v in (x, w, b))
    logits = F.linear(xb, wb, bb).detach()
    actual = torch.ops.ember.linear_cross_entropy(xb, wb, bb, t, -100, "mean", label_smoothing, 96, 8,
                                                  torch.float32, True, True, True, logits)[0]
    actual.backward()
    close(actual, expected, torch.bfloat16, "loss")
    for name, a, e in (("x", xb, ref[0]), ("W", wb, ref[1]), ("b", bb, ref[2])):
        close(a.grad, e.grad, torch.bfloat16, f"grad {name}")
