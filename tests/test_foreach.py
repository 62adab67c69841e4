"""`_foreach_*` ops (torch.optim's foreach steps, `torch._foreach_*`): decomposed into one op per list element
(graph/foreach.py), so that each element's ops fuse; results as eager's, no ATen fallback."""
import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.graph.foreach import foreach_decompositions
from ember.testing import assert_close, check, fresh_compile

aten = torch.ops.aten


@pytest.fixture
def tensors(device):
    """Three float32 tensors of different shapes (odd sizes, a 0-dim one), fresh random values."""
    def make(positive=False):
        out = [torch.randn(7, 13, device=device), torch.randn(31, device=device), torch.randn((), device=device)]
        return [t.abs() + 0.5 for t in out] if positive else out
    return make


def _no_foreach_fallback(kept=()):
    """No foreach op ran as an ATen call but the reductions in `kept`."""
    left = [op for op in ember.metrics.fallbacks if "_foreach_" in op and not op.startswith(tuple(kept))]
    assert not left, dict(ember.metrics.fallbacks)


CASES = {
    "add_list_alpha": lambda xs, ys, zs: torch._foreach_add(xs, ys, alpha=-0.7),
    "add_scalar": lambda xs, ys, zs: torch._foreach_add(xs, 1.5),
    "add_scalar_list": lambda xs, ys, zs: torch._foreach_add(xs, [0.5, -1.0, 2.0]),
    "add_tensor": lambda xs, ys, zs: torch._foreach_add(xs, zs[2], alpha=2),
    "sub_list": lambda xs, ys, zs: torch._foreach_sub(xs, ys),
    "mul_tensor": lambda xs, ys, zs: torch._foreach_mul(xs, zs[2]),
    "div_list": lambda xs, ys, zs: torch._foreach_div(xs, zs),
    "div_scalar_list": lambda xs, ys, zs: torch._foreach_div(xs, [3.0, -2.0, 0.25]),
    "pow_scalar_and_tensor": lambda xs, ys, zs: torch._foreach_pow(0.9, ys),
    "pow_list": lambda xs, ys, zs: torch._foreach_pow(zs, ys),
    "pow_scalar": lambda xs, ys, zs: torch._foreach_pow(zs, 0.5),
    "addcmul_scalar": lambda xs, ys, zs: torch._foreach_addcmul(xs, ys, zs, value=0.3),
    "addcdiv_scalar_list": lambda xs, ys, zs: torch._foreach_addcdiv(xs, ys, zs, [0.1, -0.2, 0.3]),
    "lerp_scalar": lambda xs, ys, zs: torch._foreach_lerp(xs, ys, 0.25),
    "lerp_list": lambda xs, ys, zs: torch._foreach_lerp(xs, ys, [z / 4 for z in zs]),
    "maximum_scalar": lambda xs, ys, zs: torch._foreach_maximum(xs, 0.1),
    "minimum_list": lambda xs, ys, zs: torch._foreach_minimum(xs, ys),
    "clamp_min_list": lambda xs, ys, zs: torch._foreach_clamp_min(xs, ys),
    "clamp_max_scalar_list": lambda xs, ys, zs: torch._foreach_clamp_max(xs, [0.0, 0.5, -0.5]),
    "unary_chain": lambda xs, ys, zs: torch._foreach_reciprocal(torch._foreach_sqrt(torch._foreach_exp(xs))),
    "neg_sign_abs": lambda xs, ys, zs: torch._foreach_abs(torch._foreach_neg(torch._foreach_sign(xs))),
    "norm_then_scale": lambda xs, ys, zs: torch._foreach_mul(xs, torch._foreach_reciprocal(torch._foreach_norm(xs))),
    "norm_ord_1": lambda xs, ys, zs: torch._foreach_norm(xs, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_foreach_op_matches_eager(tensors, case):
    """Each kind of overload (a list, a scalar, a list of scalars, one shared tensor, a scalar base) on tensors
    of three shapes: the element ops' results, and no foreach op left to ATen."""
    xs, ys, zs = tensors(), tensors(), tensors(positive=True)
    check(CASES[case], xs, ys, zs)
    _no_foreach_fallback(kept=["aten._foreach_norm"])


def test_addcdiv_with_a_tensor_of_values(device):
    """`_foreach_addcdiv.Tensor`: the i-th value of a 1-D CPU tensor scales the i-th quotient (an ATen graph:
    Dynamo cannot trace this overload, whose fake kernel wants the values on the CPU)."""
    xs = [torch.randn(5, 3, device=device), torch.randn(8, device=device)]
    ys = [torch.randn(5, 3, device=device), torch.randn(8, device=device)]
    zs = [torch.rand(5, 3, device=device) + 0.5, torch.rand(8, device=device) + 0.5]
    values = torch.randn(2)

    def fn(x0, x1, y0, y1, z0, z1, v):
        return tuple(aten._foreach_addcdiv.Tensor([x0, x1], [y0, y1], [z0, z1], v))
    args = [*xs, *ys, *zs, values]
    out = ember.compile_graph(make_fx(fn)(*args), args)(list(args))
    assert_close(tuple(out), fn(*args))
    _no_foreach_fallback()


def test_in_place_foreach_writes_its_inputs(tensors):
    """In-place foreach ops (`_foreach_mul_`): functionalized, decomposed, written back into the inputs."""
    xs, ys = tensors(), tensors()

    def fn(xs, ys):
        torch._foreach_mul_(xs, 0.5)
        torch._foreach_add_(xs, ys, alpha=2.0)
        return xs[0].sum()
    expected_xs = [x.clone() for x in xs]
    expected = fn(expected_xs, ys)
    out = fresh_compile(fn)(xs, ys)
    assert_close(out, expected)
    assert_close(xs, expected_xs)
    _no_foreach_fallback()


def test_every_pointwise_foreach_op_is_decomposed():
    """Every functional pointwise foreach overload torch has is decomposed; the reductions are not."""
    table = foreach_decompositions()
    assert aten._foreach_add.List in table and aten._foreach_addcdiv.Tensor in table
    assert aten._foreach_pow.ScalarAndTensor in table and aten._foreach_lerp.Scalar in table
    assert not any(op._schema.name.endswith("_") for op in table)
    # reductions stay ATen's multi-tensor launches
    assert aten._foreach_norm.Scalar not in table and aten._foreach_max.default not in table


OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw_capturable": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, capturable=True)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=1e-2, momentum=0.5)),
    "adagrad": (torch.optim.Adagrad, dict(lr=1e-2)),
    "nadam": (torch.optim.NAdam, dict(lr=1e-2)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_foreach_optimizer_step_matches_eager(device, name):
    """Three compiled `opt.step()` calls of a foreach optimizer over parameters of several shapes, each step
    with fresh random gradients: the parameters and the optimizer's state as eager's; every parameter's
    update is one kernel (AdamW: one per parameter, and one more for all the step counts)."""
    optimizer, options = OPTIMIZERS[name]
    torch.manual_seed(0)
    shapes = [(64, 33), (64, 33), (33,), (5, 7, 3)]
    eager_params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    params = [torch.nn.Parameter(p.detach().clone()) for p in eager_params]
    # eager takes capturable=True only on a GPU: its reference is the same update written for the host's step
    # counts; compiled, the capturable form (the one Dynamo picks for CUDA parameters) runs on any device
    eager_options = {**options, "capturable": False} if device == "cpu" and "capturable" in options else options
    eager_opt = optimizer(eager_params, foreach=True, **eager_options)
    opt = optimizer(params, foreach=True, **options)
    step = fresh_compile(opt.step)
    for _ in range(3):
        for p, q in zip(eager_params, params):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        eager_opt.step()
        step()
    assert_close(params, eager_params, rtol=1e-5, atol=1e-6, what="parameters")
    for p, q in zip(eager_params, params):
        # on a GPU, Dynamo makes the compiled step capturable: its step counts are CUDA tensors, eager's CPU ones
        assert_close([v.cpu() for v in opt.state[q].values()], [v.cpu() for v in eager_opt.state[p].values()],
                     rtol=1e-5, atol=1e-6, what="state")
    _no_foreach_fallback()
    if name.startswith("adamw"):
        # unfused, AdamW runs some fifteen elementwise ops per parameter
        assert ember.metrics.generated_kernel_count <= (len(shapes) + 1) * ember.metrics.graphs_compiled
