"""The C++/OpenMP kernel backend (ember/codegen/cpp/): every test runs with cpu_backend="cpp" and compares
with eager through ember.testing.check (outputs, and gradients where asked)."""
import re
import ctypes

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.codegen.cpp import build
from ember.codegen.cpp.backend import CppBackend
from ember.device import backend_for
from ember.codegen.cpp.kernel import CppKernel
from ember.ir.ops import OP_NAMES
from ember.testing import check

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16


def kernels(n):
    assert ember.metrics.generated_kernel_count == n, ember.metrics.generated_kernel_count


def no_fallbacks():
    # matmuls are ATen externs; every other op must have run in ember's kernels
    assert set(ember.metrics.fallbacks) <= {"aten.mm.default", "aten.addmm.default"}, dict(ember.metrics.fallbacks)
    assert ember.metrics.eager_fallbacks == 0


def test_handler_implements_every_op():
    k = object.__new__(CppKernel)        # the math ops resolve without kernel state
    missing = [n for n in OP_NAMES if not callable(getattr(k, n, None))]
    assert not missing, missing


# --- pointwise --------------------------------------------------------------------------------------------

def test_pointwise_chain_is_one_kernel():
    x, y = torch.randn(33, 17), torch.randn(33, 17)
    check(lambda a, b: (a * b + 1).sin().relu() - a.exp() / (b.abs() + 1), x, y)
    kernels(1)


def test_large_pointwise_runs_in_parallel_chunks():
    x = torch.randn(300_001)
    check(lambda a: torch.tanh(a) * 3 + a.sigmoid(), x)


@pytest.mark.parametrize("shapes", [((4, 5, 6), (6,)), ((4, 1, 6), (5, 1)), ((3, 4), ()), ((1,), (7, 3))])
def test_broadcasting(shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    check(lambda x, y: x * y + y, a, b)


def test_scalar_and_python_number_operands():
    check(lambda x: (x * 0.1 + 3, x - 2.5, 1.5 / (x.abs() + 1)), torch.randn(8, 9))


def test_transposes():
    a, b = torch.randn(37, 23), torch.randn(23, 37)
    check(lambda x, y: x.t() * 2 + y, a, b)
    c = torch.randn(3, 5, 7)
    check(lambda x: x.permute(2, 0, 1).contiguous() + 1, c)
    check(lambda x: (x.transpose(0, 2) * x.transpose(0, 2).sin()).sum(-1), c)


def test_strided_and_sliced_inputs():
    x = torch.randn(12, 20)
    check(lambda a: a[::2, 3:15] * 2, x)
    check(lambda a: a + 1, x[:, ::3])


UNARY = [torch.exp, torch.exp2, torch.expm1, torch.log1p, torch.sin, torch.tanh, torch.erf, torch.erfc,
         torch.erfinv, torch.lgamma, torch.sigmoid, torch.rsqrt, torch.floor, torch.ceil, torch.trunc, torch.round,
         torch.sign, torch.atan, torch.asinh]


@pytest.mark.parametrize("op", UNARY, ids=lambda f: f.__name__)
def test_unary_math(op):
    x = torch.rand(64) * 1.9 - 0.95 if op is torch.erfinv else torch.rand(64) * 6 + 0.05
    if op in (torch.sign, torch.round, torch.floor, torch.trunc, torch.sin, torch.tanh):
        x = torch.cat([x - 3, torch.tensor([2.5, -2.5, 0.5, -0.5, float("nan")])])
    check(op, x)


def test_binary_math_and_nan_propagation():
    a = torch.cat([torch.randn(40), torch.tensor([float("nan"), 1.0, float("inf")])])
    b = torch.cat([torch.randn(40), torch.tensor([1.0, float("nan"), float("-inf")])])
    check(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.atan2(x, y), torch.hypot(x, y),
                        torch.copysign(x, y), torch.fmod(x, y), torch.remainder(x, y), x.abs() ** y), a, b)


def test_float_floor_division_matches_python():
    a = torch.tensor([1.0, -1.0, 7.5, -7.5, 0.0, 5.0])
    b = torch.tensor([0.1, 0.1, -2.0, 2.0, -3.0, 0.0])
    check(lambda x, y: (torch.div(x, y, rounding_mode="floor"), torch.remainder(x, y)), a, b)


def test_float64():
    a, b = torch.randn(10, 10, dtype=F64), torch.randn(10, dtype=F64)
    check(lambda x, y: (x * y).exp().sum(-1) + torch.special.erfinv(torch.tanh(x) * 0.9).amax(-1), a, b)


# --- integers and booleans ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
def test_integer_ops(dtype):
    lo = 0 if dtype == torch.uint8 else -50
    a = torch.randint(lo, 100, (9, 11), dtype=dtype)
    b = torch.randint(1, 9, (9, 11), dtype=dtype)
    check(lambda x, y: (x + y, x * y, x - y, torch.div(x, y, rounding_mode="floor"), torch.remainder(x, y),
                        torch.fmod(x, y), x & y, x | y, x ^ y, x > y, torch.maximum(x, y), torch.where(x > y, x, y)),
          a, b)


def test_integer_wraparound_and_shifts():
    a = torch.randint(-128, 127, (64,), dtype=torch.int8)
    check(lambda x: (x * 3 + 100, x << 2, x >> 1, ~x), a)
    b = torch.randint(-2 ** 40, 2 ** 40, (64,), dtype=torch.int64)
    check(lambda x: (x << 13, x >> 7, torch.div(x, -7, rounding_mode="floor"), x % -5), b)


def test_bool_ops():
    a, b = torch.rand(10, 12) > 0.5, torch.rand(10, 12) > 0.3
    check(lambda x, y: (x & y, x | y, x ^ y, ~x, torch.logical_and(x, y), torch.logical_not(x),
                        torch.where(x, 1.5, -2.0), x.to(torch.float32) + y), a, b)


def test_int_to_float_and_back():
    a = torch.randint(-1000, 1000, (50,), dtype=torch.int32)
    check(lambda x: ((x * 0.37).to(torch.int64), x.to(torch.float16), (x.float() / 7).round().to(torch.int16)), a)


def test_int_reductions():
    a = torch.randint(-100, 100, (7, 300), dtype=torch.int32)
    check(lambda x: (x.sum(-1), x.amax(-1), x.amin(0), x.argmax(-1), x.argmin(0), x.prod(-1) % 1000,
                     (x > 90).any(-1), (x > -99).all(-1)), a)


# --- reductions ------------------------------------------------------------------------------------------------

ROWS = [1, 7, 256, 1000, 4096, 5000, 10007]


@pytest.mark.parametrize("n", ROWS)
def test_row_reductions(n):
    x = torch.randn(5, n)
    check(lambda a: (a.sum(-1), a.mean(-1), a.amax(-1), a.amin(-1), a.argmax(-1), a.argmin(-1)), x)


@pytest.mark.parametrize("n", [7, 1000, 5000])
def test_prod_any_all_var(n):
    x = torch.rand(4, n) * 0.2 + 0.95
    check(lambda a: (a.prod(-1), (a > 1.149).any(-1), (a > 0.951).all(-1), a.var(-1), a.std(-1, correction=0),
                     torch.var_mean(a, -1)), x, rtol=1e-3)


@pytest.mark.parametrize("shape", [(4096, 3), (5000, 17), (33, 4097)])
def test_column_reductions(shape):
    x = torch.randn(*shape)
    check(lambda a: (a.sum(0), a.amax(0), a.argmin(0), a.var(0)), x, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("shape", [(300, 40), (7, 200), (5000, 3)])
def test_softmax_and_normalization_across_rows(shape):
    x = torch.randn(*shape)
    check(lambda a: (torch.softmax(a, 0), (a - a.mean(0)) / (a.var(0) + 1e-5).sqrt(),
                     a.sum(0) * 2 + a.amax(0).exp()), x, rtol=1e-4, atol=1e-4)


def test_batch_norm_style_reductions():
    x = torch.randn(8, 6, 5, 7)
    check(lambda a: (a.sum((0, 2, 3)), a.var((0, 2, 3)), F.batch_norm(a, None, None, training=True)), x,
          rtol=1e-4, atol=1e-4)


def test_row_results_feed_pointwise_epilogues():
    x = torch.randn(9, 700)
    check(lambda a: (a.sum(-1) * 2 + a.amax(-1), (a - a.amax(-1, keepdim=True)).exp().sum(-1).log()), x)


def test_full_and_multi_dim_reductions():
    x = torch.randn(6, 7, 8)
    check(lambda a: (a.sum(), a.amax(), a.argmax(), a.sum((0, 2)), a.mean((1, 2), keepdim=True), a.var((0, 1))), x,
          rtol=1e-4, atol=1e-4)


def test_max_min_propagate_nan_and_argmax_picks_first():
    x = torch.randn(6, 50)
    x[1, 7] = float("nan")
    x[2, 3] = x[2, 40] = 100.0                 # tie: the first index wins
    x[3, 10] = x[3, 20] = float("nan")         # two NaNs: the first
    x[4] = float("-inf")                       # all equal: index 0
    x[5, 49] = float("nan")
    check(lambda a: (a.amax(-1), a.amin(-1), a.argmax(-1), a.argmin(-1), torch.max(a, -1)), x)


def test_argmax_ties_in_long_rows():
    x = torch.randint(0, 3, (3, 6000)).float()
    check(lambda a: (a.argmax(-1), a.argmin(-1), a.argmax(0)), x)


def test_welford_is_stable_with_a_large_mean():
    x = torch.randn(8, 3000) * 0.01 + 1000.0
    check(lambda a: (a.var(-1), a.mean(-1)), x, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("n", [7, 256, 1000, 4096, 5000])
def test_softmax_is_one_kernel(n):
    check(lambda a: torch.softmax(a, -1), torch.randn(6, n))
    kernels(1)


@pytest.mark.parametrize("n", [7, 256, 1000, 4096, 5000])
def test_layer_norm_is_one_kernel(n):
    x, w, b = torch.randn(5, n), torch.randn(n), torch.randn(n)
    check(lambda a, w_, b_: F.layer_norm(a, (n,), w_, b_), x, w, b)
    kernels(1)


def test_log_softmax_and_cross_entropy_backward():
    x, t = torch.randn(16, 300), torch.randint(0, 300, (16,))
    check(lambda a: torch.log_softmax(a, -1), x, grad=True)
    check(lambda a: F.cross_entropy(a, t), x, grad=True)


# --- narrow floats ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F16, BF16])
def test_narrow_float_pointwise_and_rounding(dtype):
    x = torch.randn(40, 30).to(dtype)
    check(lambda a: (a * 1.1 + 0.3, (a.float() * 3.3).to(dtype), a.to(torch.float32) / 3), x)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_narrow_float_conversion_edge_cases(dtype):
    info = torch.finfo(dtype)
    vals = torch.tensor([0.0, -0.0, 1.0, 65504.0, 70000.0, 1e-7, 6e-8, -3e-5, info.tiny, info.tiny / 3, info.max,
                         float("inf"), float("-inf"), float("nan"), 1.00390625, 1.01171875, 3.14159265])
    check(lambda a: (a.to(dtype), (a * 1.0001).to(dtype).to(torch.float32)), vals)
    half = torch.randn(200).to(dtype)
    check(lambda a: a.to(torch.float32) * 2, half)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_narrow_float_reductions_softmax_layer_norm(dtype):
    x, w, b = torch.randn(6, 700).to(dtype), torch.randn(700).to(dtype), torch.randn(700).to(dtype)
    check(lambda a: (a.sum(-1), a.amax(-1), a.argmax(-1), torch.softmax(a, -1)), x)
    check(lambda a, w_, b_: F.layer_norm(a, (700,), w_, b_), x, w, b)


# --- training -------------------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 10)

    def forward(self, x):
        return self.l2(self.ln(F.gelu(self.l1(x)))).softmax(-1)


def test_mlp_forward_backward():
    torch.manual_seed(0)
    model = MLP()
    check(lambda x: model(x), torch.randn(16, 32), grad=True)
    no_fallbacks()


def test_mlp_parameter_grads_match_eager():
    torch.manual_seed(0)
    eager, model = MLP(), MLP()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(16, 32)
    eager(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for pe, pc in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-5)
    assert ember.metrics.graphs_compiled == 2
    no_fallbacks()


def test_dynamic_shapes():
    f = torch.compile(lambda a: torch.softmax(a * 2, -1) + a.sum(-1, keepdim=True), backend="ember", dynamic=True)
    for n in (5, 37, 300):
        x = torch.randn(3, n)
        torch.testing.assert_close(f(x), torch.softmax(x * 2, -1) + x.sum(-1, keepdim=True))
    # sizes such as (s0 + 1) // 2 come from the ShapeEnv as torch's sympy functions
    h = torch.compile(lambda a: (a[1:, ::2] * 3, a[:, 1::3].sum(-1)), backend="ember", dynamic=True)
    for rows, cols in [(4, 5), (7, 9)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(h(x), (x[1:, ::2] * 3, x[:, 1::3].sum(-1)))
    g = torch.compile(lambda a: (a.sum(0), a.amax(0), a.var(0)), backend="ember", dynamic=True)
    for m in (70, 130):
        x = torch.randn(m, 90)
        torch.testing.assert_close(g(x), (x.sum(0), x.amax(0), x.var(0)), rtol=1e-4, atol=1e-4)


def test_thread_count_follows_torch():
    x = torch.randn(64, 4096)
    old = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            check(lambda a: torch.softmax(a, -1) * a.sum(-1, keepdim=True), x)
    finally:
        torch.set_num_threads(old)


# --- build and load --------------------------------------------------------------------------------------------

def test_kernels_are_c_functions_with_the_triton_contract():
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember.compile_graph import compile_graph
    x = torch.randn(4, 8)
    with ember.config.patch(wrapper="python"):      # the check below reads the Python wrapper's source
        compiled = compile_graph(make_fx(lambda a: torch.softmax(a, -1))(x), [x])
    assert "extern \"C\"" in compiled.kernels[0].source
    assert compiled.kernels[0].define.backend is backend_for("cpu") and backend_for("cpu").name == "cpp"
    assert re.search(r"kernel0(_\w+)?_site0\(\(1,\), ", compiled.source), compiled.source


def test_library_cache_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    src = build.PRELUDE + '// ember-args: 0 0\nextern "C" int f(int ember_threads) { return 0; }\n'
    p1 = build.build(src)
    mtime = __import__("os").path.getmtime(p1)
    assert build.build(src) == p1 and __import__("os").path.getmtime(p1) == mtime
    assert ctypes.CDLL(p1).f(1) == 0


def test_build_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_toolchain", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(build.CppBuildError, match="cpu_backend"):
        build.build("int x;")
    monkeypatch.setattr(build, "_toolchain", {})
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    with pytest.raises(build.CppBuildError, match="(?s)cpu_backend.*error"):
        build.build("this is not C++;")


def test_backend_is_selected_by_config():
    from ember.device import backend_for
    assert isinstance(backend_for(torch.device("cpu")), CppBackend)


# --- kernels driven directly (ops no lowering emits yet) ------------------------------------------------------

class _Graph:
    def __init__(self, bufs):
        self.bufs = bufs

    def get_dtype(self, name):
        return self.bufs[name].layout.dtype

    def get_buffer(self, name):
        return self.bufs[name]


def _run_kernel(inner_fn, out_size, out_dtype, inputs: dict):
    """Build one pointwise ComputedBuffer `out` from inner_fn, generate and run its C++ kernel."""
    import sympy
    from ember.codegen.cpp.build import load_cpp_kernels
    from ember.ir.nodes import ComputedBuffer, InputBuffer, Layout, Pointwise
    from ember.schedule.fusion import FusedGroup, build_nodes
    cpu = torch.device("cpu")
    bufs = {n: InputBuffer(n, Layout.from_tensor(t)) for n, t in inputs.items()}
    size = [sympy.Integer(s) for s in out_size]
    out = ComputedBuffer("out", Layout.contiguous(cpu, out_dtype, size), Pointwise(cpu, out_dtype, inner_fn, size))
    bufs["out"] = out
    gen = CppBackend().generate("k", FusedGroup(build_nodes([out])), _Graph(bufs), set())
    launch = load_cpp_kernels([gen.define])["k"]
    result = torch.empty(out_size, dtype=out_dtype)
    tensors = dict(inputs, out=result)
    launch[(1,)](*[tensors[a] if isinstance(a, str) else int(a) for a in gen.call.args])
    return result


def test_indirect_indexing_wraps_negative_indices_and_checks_bounds():
    from ember.ir.ops import ops
    src = torch.randn(10, 4)

    def gather(i):
        row = ops.indirect_indexing(ops.load("idx", i[0]), 10)
        return ops.load("src", row * 4 + i[1])

    idx = torch.tensor([0, 3, -1, 9, -10, 5])
    torch.testing.assert_close(_run_kernel(gather, (6, 4), F32, {"src": src, "idx": idx}), src[idx])
    with pytest.raises(IndexError, match="out of range"):
        _run_kernel(gather, (6, 4), F32, {"src": src, "idx": torch.tensor([0, 1, 10, 2, 3, 4])})
    with pytest.raises(IndexError, match="out of range"):
        _run_kernel(gather, (6, 4), F32, {"src": src, "idx": torch.tensor([0, 1, -11, 2, 3, 4])})


def test_in_place_updates_of_several_inputs():
    def step(p, g, m):
        m.mul_(0.9).add_(g)
        p.add_(m, alpha=-0.1)
        return p.sum()

    args = [torch.randn(5000) for _ in range(3)]
    ref = [a.clone() for a in args]
    expected = step(*ref)
    torch.testing.assert_close(torch.compile(step, backend="ember")(*args), expected)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a, r)
