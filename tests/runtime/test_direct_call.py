"""runtime/direct_call.py: an inference graph whose AOTAutograd wrapper has nothing to do is called
without it, and behaves as eager does (values, grad mode, autocast, aliasing, mutation, dynamic shapes);
a graph whose wrapper has work to do keeps it."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import assert_close, fresh_compile


def run_twice(fn, *args, **kw):
    """The compiled fn's second call (the first runs through AOTAutograd's callable) and eager's result."""
    compiled = fresh_compile(fn, **kw)
    compiled(*args)
    return compiled(*args), fn(*args)


def test_a_kernel_only_graph_is_called_directly_under_grad_mode(device):
    x, y = torch.randn(33, 17, device=device), torch.randn(17, device=device)
    actual, expected = run_twice(lambda a, b: (a * b + 1).sin().sum(0), x, y)
    assert ember.metrics.direct_graphs == 1
    assert_close(actual, expected)
    assert not actual.requires_grad


def test_a_module_under_no_grad_is_called_directly(device):
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).to(device)
    x = torch.randn(8, 16, device=device)
    with torch.no_grad():
        actual, expected = run_twice(m, x)
    assert ember.metrics.direct_graphs == 1
    assert_close(actual, expected)


def test_aten_calls_run_with_grad_mode_off(device):
    # the matmul is an ATen call: under grad mode with a weight that does not require grad, the output
    # must not require grad and must carry no autograd history
    w = torch.randn(16, 16, device=device)
    x = torch.randn(4, 16, device=device)
    actual, expected = run_twice(lambda a: (a @ w).relu() + 1, x)
    assert ember.metrics.direct_graphs == 1
    assert_close(actual, expected)
    assert not actual.requires_grad and actual.grad_fn is None


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_autocast_keeps_its_meaning(device, dtype):
    dev = torch.device(device).type
    a, b = torch.randn(8, 16, device=device), torch.randn(16, 12, device=device)

    def f(x, y):
        return (x @ y).float().softmax(-1) + x.sum()

    with torch.autocast(dev, dtype=dtype):
        actual, expected = run_twice(f, a, b)
    assert_close(actual, expected, rtol=2e-2, atol=2e-2)


def test_an_output_that_views_an_input_keeps_the_wrapper(device):
    x = torch.randn(6, 8, device=device)
    compiled = fresh_compile(lambda a: (a.view(-1), a.exp()))
    compiled(x)
    v, e = compiled(x)
    assert ember.metrics.direct_graphs == 0
    assert v._base is x and v.data_ptr() == x.data_ptr()
    assert_close(e, x.exp())


def test_a_mutated_input_keeps_the_wrapper(device):
    x = torch.randn(6, 8, device=device)
    x_ref = x.clone()
    compiled = fresh_compile(lambda a: a.mul_(2).sum())
    compiled(x)
    s = compiled(x)
    assert ember.metrics.direct_graphs == 0
    assert_close(x, x_ref * 4)
    assert_close(s, (x_ref * 4).sum())


def test_a_training_graph_keeps_autograd(device):
    x = torch.randn(5, 7, device=device, requires_grad=True)
    compiled = fresh_compile(lambda a: (a.sin() * 2).sum())
    compiled(x).backward()
    assert ember.metrics.direct_graphs == 0
    assert_close(x.grad, 2 * x.detach().cos())


def test_dynamic_shapes_mark_outputs_as_the_wrapper_does(device):
    f = lambda a: (a * 2).relu()      # noqa: E731
    outs = {}
    for direct in (True, False):
        with ember.config.patch(direct_inference_call=direct):
            compiled = fresh_compile(f, dynamic=True)
            for n in (9, 13):
                x = torch.randn(n, 4, device=device)
                out = compiled(x)
                assert_close(out, f(x))
        outs[direct] = getattr(out, "_dynamo_propagated_dynamic_indices", None)
    assert outs[True] == outs[False]


def test_off_switch(device):
    x = torch.randn(16, device=device)
    with ember.config.patch(direct_inference_call=False):
        actual, expected = run_twice(lambda a: a.cos() * 3, x)
    assert ember.metrics.direct_graphs == 0
    assert_close(actual, expected)
