"""Never break the user's program: ops ember does not lower run as ATen fallbacks inside the compiled
graph; inputs mutated in place, aliased and returned outputs behave as in eager; a graph that fails to
compile runs eagerly with one warning (or raises, with config.fallback_on_error=False)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.lowering import registry
from ember.testing import assert_close, check, fresh_compile

aten = torch.ops.aten


def fallback_count(name: str) -> int:
    return sum(n for op, n in ember.metrics.fallbacks.items() if op.startswith(f"aten.{name}."))


# --- ATen fallbacks inside compiled graphs ---------------------------------------------------------------------

def test_sort_is_a_fallback_mixed_with_kernels(device):
    x = torch.randn(6, 17, device=device)
    check(lambda a: (torch.sort(a.sin() * 2, dim=-1).values + 1).relu(), x)
    assert fallback_count("sort") == 1
    assert ember.metrics.generated_kernel_count >= 2      # a kernel before and one after the sort
    assert ember.metrics.eager_fallbacks == 0


def test_sort_indices_and_descending(device):
    x = torch.randn(5, 9, device=device)
    check(lambda a: torch.sort(a * 3, dim=0, descending=True), x)
    assert fallback_count("sort") == 1


def test_cummax_fallback(device):
    x = torch.randn(4, 33, device=device)
    check(lambda a: torch.cummax(a.exp(), 1).values / a.exp().sum(1, keepdim=True), x)
    assert fallback_count("cummax") == 1
    assert ember.metrics.eager_fallbacks == 0


def test_topk_two_outputs(device):
    x = torch.randn(4, 20, device=device)
    values, indices = check(lambda a: torch.topk(a * 2 + 1, 5, dim=1), x)
    assert values.shape == (4, 5) and indices.dtype == torch.int64
    assert fallback_count("topk") == 1


def test_topk_outputs_consumed_by_kernels(device):
    x = torch.randn(4, 20, device=device)
    check(lambda a: (lambda v, i: (v.softmax(-1) * (i.float() + 1)).sum(-1))(*torch.topk(a.cos(), 3)), x)
    assert fallback_count("topk") == 1


def test_mm_bmm_fallbacks_with_epilogues(device):
    a, b = torch.randn(8, 16, device=device), torch.randn(16, 12, device=device)
    c, d = torch.randn(3, 8, 5, device=device), torch.randn(3, 5, 7, device=device)
    check(lambda x, y, p, q: ((x.relu() @ y).tanh() + 1, torch.bmm(p * 2, q).softmax(-1)), a, b, c, d)
    assert fallback_count("mm") + fallback_count("bmm") >= 2
    assert ember.metrics.eager_fallbacks == 0


def test_matmul_fallback_grad(device):
    a, b = torch.randn(8, 16, device=device), torch.randn(16, 12, device=device)
    check(lambda x, y: (x.sin() @ y).relu(), a, b, grad=True)


def test_fallback_of_a_transposed_computed_value(device):
    # the ATen op gets the layout eager would give it, and ember reads its output with the strides
    # that op really returns (sort/i0 of a transposed input return transposed outputs)
    x = torch.randn(4, 6, device=device)
    check(lambda a: (torch.sort(a.t() * 2, 0)[0] + 1, torch.i0(a.t() * 2) + 1,
                     torch.cummax(a.t() * 2, 1).values * 3), x)


def test_transposed_extern_input_is_computed_in_memory_order(device, tmp_path):
    """mm's operand w.t() * 2 gets eager's strides, w's order: the kernel computing it walks that memory
    in order (its buffer is [12, 16] contiguous, the operand a transposed view of it), not the value's
    own [16, 12] dims with a stride of 16 on every store."""
    a, w = torch.randn(8, 16, device=device), torch.randn(12, 16, device=device)
    with ember.config.patch(debug=True, debug_dir=str(tmp_path)):
        check(lambda x, w: x @ (w.t() * 2), a, w)
    (ir,) = [p.read_text() for p in tmp_path.glob("*/ir_pre_fusion.txt")]
    assert "ComputedBuffer float32[12, 16] stride=[16, 1]" in ir, ir


def test_fallback_of_a_transposed_stored_value(device):
    x = torch.randn(4, 6, device=device)

    def fn(a):
        b = (a * 2).exp()           # read by several consumers: stored
        c = b.t()
        return torch.sort(c, 1)[0] * b.sum(), torch.digamma(c) - b.mean(), c.sin()
    check(fn, x)


def test_fallback_taking_a_list_of_computed_values(device):
    a, b = torch.randn(4, 6, device=device), torch.randn(6, 4, device=device)
    check(lambda x, y: (torch.cat([x.t() * 2, y.sin()], 1) + 1, torch.stack([x.t().exp(), y], 0).sum(0)), a, b)


def test_fallback_outputs_returned_directly(device):
    x = torch.randn(5, 7, device=device)
    check(lambda a: (torch.sort(a, 1)[1], torch.cummax(a, 0).values, torch.i0(a)), x)


# --- mutation of graph inputs -------------------------------------------------------------------------------

def check_mutation(fn, *args, rtol=None, atol=None):
    """Run fn eagerly and compiled on copies of args; compare outputs and the mutated args."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ember_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*eager_args)
    actual = fresh_compile(fn)(*ember_args)
    assert_close(actual, expected, rtol, atol)
    assert_close(ember_args, eager_args, rtol, atol, what="input after the call")
    assert ember.metrics.eager_fallbacks == 0
    return actual


def test_add_in_place_on_input(device):
    def fn(x):
        x.add_(1)
        return x * 2
    check_mutation(fn, torch.randn(4, 5, device=device))


def test_several_in_place_ops_on_inputs(device):
    def fn(x, y):
        x.mul_(2).add_(y)
        y.sub_(1)
        return (x + y).sum()
    check_mutation(fn, torch.randn(4, 5, device=device), torch.randn(4, 5, device=device))


def test_copy_into_input(device):
    def fn(buf, y):
        buf.copy_(y.sin())
        return buf + 1
    check_mutation(fn, torch.randn(6, 3, device=device), torch.randn(6, 3, device=device))


def test_copy_with_broadcast_and_cast(device):
    def fn(buf, y):
        buf.copy_(y)          # y is float32 and broadcasts over buf's rows
        return buf
    check_mutation(fn, torch.randn(6, 3, device=device, dtype=torch.float16), torch.randn(3, device=device))


def test_index_put_on_input(device):
    def fn(x, idx, v):
        x[idx] = v * 2
        return x.sum(0)
    idx = torch.tensor([0, 3, 5], device=device)
    check_mutation(fn, torch.randn(6, 4, device=device), idx, torch.randn(3, 4, device=device))


def test_index_put_accumulate_on_input(device):
    def fn(x, idx, v):
        x.index_put_((idx,), v, accumulate=True)
        return x * 1
    idx = torch.tensor([1, 1, 4], device=device)
    check_mutation(fn, torch.randn(6, 4, device=device), idx, torch.randn(3, 4, device=device))


def test_mutation_of_a_slice_of_input(device):
    def fn(x):
        x[1:3].mul_(10)
        x[:, 0] = 0.5
        return x.amax(1)
    check_mutation(fn, torch.randn(5, 4, device=device))


def test_mutation_of_non_contiguous_input(device):
    def fn(x):
        x.add_(x.mean())
        return x.t().clone()
    base = torch.randn(6, 4, device=device)
    eager_x, ember_x = base.clone().t(), base.clone().t()
    expected = fn(eager_x)
    actual = fresh_compile(fn)(ember_x)
    assert_close(actual, expected)
    assert_close(ember_x, eager_x)


def test_running_stats_style_update(device):
    def fn(buf, x):
        buf.mul_(0.9).add_(x.mean(0) * 0.1)
        return (x - buf).relu()
    check_mutation(fn, torch.randn(8, device=device), torch.randn(5, 8, device=device))


def test_mutation_then_read_in_same_graph(device):
    def fn(x, y):
        before = x * 1
        x.add_(y)
        return before, x * 3
    check_mutation(fn, torch.randn(4, 5, device=device), torch.randn(4, 5, device=device))


def test_swap_inputs_in_place(device):
    def fn(x, y):
        t = x.clone()
        x.copy_(y)
        y.copy_(t)
        return x + y
    check_mutation(fn, torch.randn(4, 5, device=device), torch.randn(4, 5, device=device))


def test_in_place_update_reading_other_elements(device):
    # the new value reads the input at other positions: every read must see the old contents
    def fn(x):
        x.copy_(x.flip(0) + x.t() * 2)
        return x.sum()
    check_mutation(fn, torch.randn(16, 16, device=device))


def test_in_place_update_reading_another_mutated_input(device):
    def fn(x, y):
        x.add_(1)
        y.mul_(x.sum())        # the new x
        x.sub_(y.mean())       # the new y
        return x * y
    check_mutation(fn, torch.randn(4, 5, device=device), torch.randn(4, 5, device=device))


def test_mutation_value_also_returned(device):
    def fn(x):
        y = x.add_(1)
        return y * 2, y.sum(), x.t()
    check_mutation(fn, torch.randn(4, 5, device=device))


def test_int_and_bool_input_mutation(device):
    def fn(i, b, x):
        i.add_(3)
        b.logical_not_()
        return x * i + b
    check_mutation(fn, torch.randint(-5, 5, (4, 5), device=device), torch.rand(4, 5, device=device) > 0.5,
                   torch.randn(4, 5, device=device))


# --- outputs: several, aliasing, unchanged ------------------------------------------------------------------------

def test_multiple_outputs(device):
    x = torch.randn(4, 5, device=device)
    out = check(lambda a: (a.sin(), a.sum(1), a.amax(0), a > 0, (a * 2).int()), x)
    assert len(out) == 5


def test_return_input_unchanged(device):
    x = torch.randn(4, 5, device=device)
    fn = fresh_compile(lambda a: (a, a * 2))
    out = fn(x)
    assert out[0] is x or out[0].data_ptr() == x.data_ptr()
    torch.testing.assert_close(out[1], x * 2)


def test_return_views_of_input(device):
    x = torch.randn(4, 6, device=device)
    fn = fresh_compile(lambda a: (a.t(), a[1:3], a.view(2, 12), a.unsqueeze(0), a[:, 2]))
    outs = fn(x)
    expected = (x.t(), x[1:3], x.view(2, 12), x.unsqueeze(0), x[:, 2])
    for o, e in zip(outs, expected):
        torch.testing.assert_close(o, e)
        assert o.stride() == e.stride()
        assert o.data_ptr() == e.data_ptr(), "a view of an input aliases it, as in eager"


def test_output_aliases_mutated_input(device):
    def fn(x):
        x.add_(2)
        return x, x[0]
    check_mutation(fn, torch.randn(3, 4, device=device))


def test_same_value_returned_twice(device):
    x = torch.randn(4, 5, device=device)
    out = check(lambda a: (lambda y: (y, y, y.t()))(a.exp()), x)
    assert out[0].data_ptr() == out[1].data_ptr()


def test_outputs_with_grad_and_aliasing(device):
    x = torch.randn(4, 6, device=device)
    check(lambda a: (a.sin(), a.sin().t(), (a * 2)[1:]), x, grad=True)


# --- a graph that fails to compile ---------------------------------------------------------------------------

class _Boom(RuntimeError):
    pass


@pytest.fixture
def broken_sin(monkeypatch):
    """A lowering of aten.sin that fails with an error that is not Unsupported."""
    def boom(*args, **kwargs):
        raise _Boom("this lowering is broken")
    registry.load_all()
    monkeypatch.setitem(registry.lowerings, aten.sin.default, boom)


def _ember_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning) and "ember" in str(w.message)]


def test_compile_failure_runs_eagerly_with_one_warning(device, broken_sin):
    x = torch.randn(4, 5, device=device)
    fn = lambda a: (a.sin() + 1).relu()  # noqa: E731
    with ember.config.patch(fallback_on_error=True):
        compiled = fresh_compile(fn)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out1 = compiled(x)
            out2 = compiled(x * 2)
    torch.testing.assert_close(out1, fn(x))
    torch.testing.assert_close(out2, fn(x * 2))
    ours = _ember_warnings(record)
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "aten.sin" in str(ours[0].message)
    assert ember.metrics.eager_fallbacks == 1


def test_compile_failure_with_grad_runs_eagerly(device, broken_sin):
    x = torch.randn(4, 5, device=device)
    with ember.config.patch(fallback_on_error=True):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            check(lambda a: (a.sin() * a).sum(), x, grad=True)
    ours = _ember_warnings(record)
    assert len(ours) >= 1 and all("aten.sin" in str(w.message) for w in ours)


def test_compile_failure_raises_when_asked(device, broken_sin):
    x = torch.randn(4, 5, device=device)
    with ember.config.patch(fallback_on_error=False):
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
            fresh_compile(lambda a: (a.sin() + 1).relu())(x)
    assert "aten.sin" in str(info.value)
    assert "this lowering is broken" in str(info.value)


def test_unsupported_falls_back_per_op_not_per_graph(device, monkeypatch):
    # Unsupported (unlike any other error) makes just that op an ATen fallback
    def unsupported(*args, **kwargs):
        raise registry.Unsupported("not this case")
    registry.load_all()
    monkeypatch.setitem(registry.lowerings, aten.sin.default, unsupported)
    x = torch.randn(4, 5, device=device)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        check(lambda a: (a.sin() + 1).relu(), x)
    assert fallback_count("sin") == 1
    assert not _ember_warnings(record)
    assert ember.metrics.eager_fallbacks == 0


def test_fallback_ops_counted_by_name(device):
    x = torch.randn(4, 6, device=device)
    check(lambda a: (torch.sort(a, 1)[0] + torch.cummax(a, 1).values, torch.sort(a * 2, 0)[0]), x)
    assert fallback_count("sort") == 2
    assert fallback_count("cummax") == 1


def test_conv_fallback_with_fused_epilogue(device):
    x, w, b = torch.randn(2, 3, 8, 8, device=device), torch.randn(4, 3, 3, 3, device=device), torch.randn(4, device=device)
    check(lambda a, ww, bb: F.relu(F.conv2d(a * 2, ww, bb, padding=1)).mean((2, 3)), x, w, b, grad=True)
    assert fallback_count("convolution") >= 1


@pytest.mark.parametrize("grad", [False, True])
def test_an_extern_reading_a_view_of_a_returned_value_shares_its_buffer(device, grad):
    """Attention probabilities: softmax in 4-D, read by a bmm in 3-D and returned (or saved for the
    backward) in 4-D. The bmm's operand is a view of the stored probabilities, not a second stored copy
    of the same values (BERT's forward wrote each attention matrix twice)."""
    def fn(x, v):
        p = torch.softmax(x, -1)
        return torch.bmm(p.view(12, 16, 16), v), p

    x, v = torch.randn(4, 3, 16, 16, device=device), torch.randn(12, 16, 8, device=device)
    ember.metrics.reset()
    with torch.set_grad_enabled(grad):
        check(fn, x, v, grad=grad)
    if not grad:
        assert ember.metrics.buffers_allocated == 1, ember.metrics.summary()
    else:      # forward: the probabilities, saved and returned; backward: the softmax gradient
        assert ember.metrics.buffers_allocated <= 3, ember.metrics.summary()
