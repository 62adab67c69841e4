"""The GEMM template (codegen/triton/gemm_template.py) through Triton's interpreter: mm, addmm and bmm with their
pointwise consumers fused into the template's output tile, against eager on fresh random inputs.

Runs with EMBER_CPU_BACKEND=triton (the template is Triton code), or on a GPU with EMBER_TEST_DEVICE=cuda;
the sizes are small and off every block size, since the interpreter runs each program's operations one by
one."""
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.runtime.template_choice import TemplateChoice
from ember.testing import assert_close, check

DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
pytestmark = [pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("EMBER_CPU_BACKEND") != "triton",
                                 reason="the GEMM template is Triton code: run with EMBER_CPU_BACKEND=triton"),
              pytest.mark.usefixtures("exact_float32_convolutions")]
interpreter_only = pytest.mark.skipif(DEVICE != "cpu", reason="what the CPU backends do")

F = torch.nn.functional
BF16 = torch.bfloat16


def _rand(*shape, dtype=torch.float32):
    # scaled so that products over K ~ 40 stay near 1, where bfloat16's rounding is ~4e-3 relative
    return (torch.randn(*shape) * 0.4).to(dtype=dtype, device=DEVICE)


def _compile(fn, *args, mode="always"):
    """fn compiled as an ATen graph with gemm_templates=mode; returns (outputs, kernel sources)."""
    with ember.config.patch(gemm_templates=mode, graph_cache=False):
        compiled = ember.compile_graph(make_fx(fn)(*args), list(args))
        out = compiled(list(args))
    assert_close(tuple(out), tuple(fn(*args)))
    return out, [gen.source for gen in compiled.kernels]


def _templates(sources) -> list:
    return [s for s in sources if "BLOCK_K: tl.constexpr" in s]


def _only_templates(sources, count: int) -> list:
    """Every kernel is one of `count` template kernels: no separate kernel reads or writes a product."""
    templates = _templates(sources)
    assert len(templates) == count and len(sources) == count, sources
    return templates


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_linear_bias_gelu_is_one_kernel(dtype):
    """x @ W.t() + b, then GELU: the transposed weight is read in place, bias and GELU run on the tile."""
    x, w, b = _rand(64, 40, dtype=dtype), _rand(48, 40, dtype=dtype), _rand(48, dtype=dtype)
    _, sources = _compile(lambda x, w, b: (F.gelu(F.linear(x, w, b)),), x, w, b)
    (src,) = _only_templates(sources, 1)
    assert "erf" in src and "tl.store(" in src and src.count("tl.store(") == 1
    assert ember.metrics.template_kernels == 1 and ember.metrics.fused_epilogue_nodes >= 1


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_addmm_scaled_bias_odd_sizes(dtype):
    """addmm with alpha and beta, sizes prime (no block divides them), a 2-D bias; its result read twice."""
    c, a, b = _rand(37, 29, dtype=dtype), _rand(37, 23, dtype=dtype), _rand(23, 29, dtype=dtype)
    _, sources = _compile(lambda c, a, b: (torch.addmm(c, a, b, beta=0.5, alpha=2.0).relu(),
                                           torch.addmm(c, a, b, beta=0.5, alpha=2.0) * 3), c, a, b)
    assert len(_templates(sources)) >= 1 and all("tl.dot(" in s for s in sources)


@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (5, 1, 1), (1, 1, 7)])
def test_sizes_of_one(m, n, k):
    a, b, c = _rand(m, k), _rand(k, n), _rand(n)
    _, sources = _compile(lambda a, b, c: (torch.sigmoid(a @ b) + c,), a, b, c)
    _only_templates(sources, 1)


def test_residual_add_and_cast_to_bf16():
    """mm + residual in float32, cast to bfloat16 on the tile: the float32 product is never stored."""
    x, w, r = _rand(64, 40), _rand(40, 48), _rand(64, 48)
    out, sources = _compile(lambda x, w, r: ((x @ w + r).to(BF16),), x, w, r)
    (src,) = _only_templates(sources, 1)
    assert out[0].dtype == BF16 and "tl.bfloat16" in src


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_bmm_scaled_residual(dtype):
    a, b, r = _rand(2, 32, 24, dtype=dtype), _rand(2, 24, 40, dtype=dtype), _rand(2, 32, 40, dtype=dtype)
    _, sources = _compile(lambda a, b, r: (torch.bmm(a, b) * 0.125 + r,), a, b, r)
    (src,) = _only_templates(sources, 1)
    assert "tb = (tile // tiles_per_batch)" in src      # the batch entry of each tile the program walks


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_programs_walk_several_tiles(dtype):
    """A product of more tiles than the persistent grid has programs: each program walks several tiles, of
    several batch entries, and every tile's epilogue (tanh-GELU on a residual) lands where it belongs."""
    a, b, r = _rand(3, 131, 29, dtype=dtype), _rand(3, 29, 67, dtype=dtype), _rand(3, 131, 67, dtype=dtype)
    _, sources = _compile(lambda a, b, r: (F.gelu(torch.bmm(a, b) + r, approximate="tanh"),), a, b, r)
    (src,) = _only_templates(sources, 1)
    assert "tl.num_programs(0)" in src


def test_bmm_of_transposed_operands():
    """Batched operands given transposed (strided views of the inputs, read in place)."""
    a, b = _rand(2, 24, 32), _rand(2, 40, 24)
    _, sources = _compile(lambda a, b: (torch.bmm(a.transpose(1, 2), b.transpose(1, 2)).sigmoid(),), a, b)
    _only_templates(sources, 1)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_swiglu_of_two_products(dtype):
    """silu(x @ Wg) * (x @ Wu): one product is stored by its template, the other template's tile computes
    SiLU and the product of the two; nothing else runs."""
    x, wg, wu = _rand(64, 40, dtype=dtype), _rand(48, 40, dtype=dtype), _rand(48, 40, dtype=dtype)
    _, sources = _compile(lambda x, wg, wu: (F.silu(x @ wg.t()) * (x @ wu.t()),), x, wg, wu)
    templates = _only_templates(sources, 2)
    assert sum("sigmoid" in s for s in templates) == 1


def test_product_read_elsewhere_is_stored_once_with_its_epilogue():
    """A product that is also returned is stored by the template, which computes its consumer too."""
    a, b = _rand(33, 17), _rand(17, 29)

    def f(a, b):
        p = a @ b
        return p, torch.tanh(p) * 2
    out, sources = _compile(f, a, b)
    (src,) = _only_templates(sources, 1)
    assert src.count("tl.store(") == 2


def test_empty_k_gives_zeros_plus_epilogue():
    a, b, c = _rand(16, 0), _rand(0, 24), _rand(16, 24)
    _, sources = _compile(lambda a, b, c: (a @ b + c,), a, b, c)
    _only_templates(sources, 1)


def test_consumer_reading_the_product_transposed_is_a_kernel_of_its_own():
    """A consumer that reads the product at other elements than each tile holds (its transpose) cannot run on
    the tile: the product is stored, and read by a separate kernel."""
    a, b, c = _rand(24, 40), _rand(40, 32), _rand(32, 24)
    _, sources = _compile(lambda a, b, c: ((a @ b).t() + c,), a, b, c)
    assert len(_templates(sources)) == 1 and len(sources) == 2


def test_mlp_forward_and_backward():
    """Linear -> GELU -> Linear, trained: the forward's and backward's products (with transposed operands)
    are templates, gradients as eager's."""
    model = torch.nn.Sequential(torch.nn.Linear(40, 48), torch.nn.GELU(), torch.nn.Linear(48, 24)).to(DEVICE)
    for p in model.parameters():
        p.data.mul_(0.5)
    x = _rand(32, 40, dtype=torch.float32).requires_grad_()

    def step(x):
        return model(x).tanh()
    with ember.config.patch(gemm_templates="always"):
        check(step, x, grad=True)
    assert ember.metrics.template_kernels >= 4
    assert not any("mm" in op for op in ember.metrics.fallbacks)


# -- row-vector products (M = 1): programs over columns, no tl.dot -----------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_row_vector_linear_bias_gelu_is_one_kernel(dtype):
    """One row through a linear layer (a decoding step): the row-vector loop reads the transposed weight in
    place along K, bias and tanh-GELU run on its tile; N and K are primes, no block divides them."""
    x, w, b = _rand(1, 67, dtype=dtype), _rand(53, 67, dtype=dtype), _rand(53, dtype=dtype)
    _, sources = _compile(lambda x, w, b: (F.gelu(F.linear(x, w, b), approximate="tanh"),), x, w, b)
    (src,) = _only_templates(sources, 1)
    assert "# mv:" in src and "tl.dot(" not in src and src.count("tl.store(") == 1


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_row_vector_swiglu_and_residual(dtype):
    """A decoder's MLP for one token: gate and up as one product split in two, then the down product with the
    residual added on its tile. SiLU(gate) * up reads two columns of the first product per element, so it is
    a kernel of its own."""
    x, w13, w2 = _rand(1, 40, dtype=dtype), _rand(2 * 37, 40, dtype=dtype), _rand(40, 37, dtype=dtype)

    def f(x, w13, w2):
        g, u = F.linear(x, w13).chunk(2, dim=-1)
        return (x + F.linear(F.silu(g) * u, w2),)
    _, sources = _compile(f, x, w13, w2)
    templates = _templates(sources)
    assert len(templates) == 2 and all("# mv:" in s for s in templates) and len(sources) == 3
    assert templates[1].count("tl.store(") == 1       # the residual added on the tile, only the sum stored


def test_row_vector_linear_forward_and_backward():
    """A linear layer trained on one row: its input gradient (one row times the weight, read along N) is a
    row-vector product too, its weight gradient an outer product (K = 1)."""
    model = torch.nn.Linear(45, 31).to(DEVICE)
    x = _rand(1, 45).requires_grad_()
    with ember.config.patch(gemm_templates="always"):
        check(lambda x: model(x).sin(), x, grad=True)
    assert not any("mm" in op for op in ember.metrics.fallbacks)


def test_gpu_backend_prefers_wide_row_vector_linears():
    """The Triton backend on a GPU takes its template for a row-vector product read along K, N at least
    MATVEC_MIN_N and K at most MATVEC_MAX_K_PER_N times N, without timing; not for a matrix, a bmm, a long
    K, a narrow N or a weight read across its rows; never under the interpreter."""
    from ember.codegen.triton.backend import MATVEC_MAX_K_PER_N, MATVEC_MIN_N, TritonBackend
    from ember.ir.template import ProductSpec
    gpu, interpreter = TritonBackend(interpret=False), TritonBackend(interpret=True)

    def spec(m, n, k, op="mm", weight_t=True):
        b = ((k, n), (1, k)) if weight_t else ((k, n), (n, 1))
        a = ((m, k), (k, 1)) if op == "mm" else ((1, m, k), (m * k, k, 1))
        if op == "bmm":
            b = ((1, k, n), (k * n, 1, k))
        return ProductSpec(op, a, b, None, BF16, 0.0)
    assert gpu.prefers_template(spec(1, 1536, 1024)) and gpu.prefers_template(spec(1, 32000, 4096))
    assert not interpreter.prefers_template(spec(1, 1536, 1024))
    assert not gpu.prefers_template(spec(2, 1536, 1024))
    assert not gpu.prefers_template(spec(1, 1536, 1024, op="bmm"))
    assert gpu.prefers_template(spec(1, 1024, 2816)) and gpu.prefers_template(spec(1, 4096, 11008))
    assert not gpu.prefers_template(spec(1, 1024, 1024 * MATVEC_MAX_K_PER_N + 1))
    assert not gpu.prefers_template(spec(1, MATVEC_MIN_N // 2, 256))
    assert not gpu.prefers_template(spec(1, 1536, 1024, weight_t=False))


def test_matvec_uses_the_template_where_the_backend_prefers_it(monkeypatch):
    """gemm_templates="matvec" (the default): a product the backend prefers is a template with its epilogue,
    with no timing; the others stay library calls."""
    from ember.codegen.triton.backend import TritonBackend
    monkeypatch.setattr(TritonBackend, "prefers_template", lambda self, spec: spec.sizes()[1] == 1)
    x, w, m = _rand(1, 40), _rand(48, 40), _rand(6, 40)
    ember.metrics.reset()
    _, sources = _compile(lambda x, w, m: ((x @ w.t()).relu(), (m @ w.t()).relu()), x, w, m, mode="matvec")
    assert len(_templates(sources)) == 1 and ember.metrics.template_kernels == 1
    assert ember.metrics.fallbacks["aten.mm.default"] == 1


@interpreter_only
def test_auto_and_never_keep_the_library_call_on_the_interpreter():
    """gemm_templates="auto" uses the template only where it can be timed against the library: not in the
    interpreter; "matvec" only where the GPU's backend prefers it: not in the interpreter either. "never":
    nowhere."""
    a, b = _rand(16, 24), _rand(24, 32)
    for mode in ("auto", "matvec", "never"):
        ember.metrics.reset()
        _, sources = _compile(lambda a, b: ((a @ b).relu(),), a, b, mode=mode)
        assert not _templates(sources) and ember.metrics.template_kernels == 0
        assert ember.metrics.fallbacks["aten.mm.default"] == 1


@interpreter_only
def test_cpp_backend_keeps_matmuls_extern():
    a, b = _rand(16, 24), _rand(24, 32)
    with ember.config.patch(cpu_backend="cpp", gemm_templates="always", graph_cache=False):
        compiled = ember.compile_graph(make_fx(lambda a, b: (a @ b,))(a, b), [a, b])
        assert_close(tuple(compiled([a, b])), (a @ b,))
    assert ember.metrics.template_kernels == 0 and ember.metrics.fallbacks["aten.mm.default"] == 1


def test_symbolic_sizes_use_the_library_call():
    def f(a, b):
        return (a @ b).relu()
    a, b = _rand(16, 24), _rand(24, 32)
    with ember.config.patch(gemm_templates="always"):
        check(f, a, b, dynamic=True)
    assert ember.metrics.fallbacks["aten.mm.default"] >= 1


@pytest.fixture
def timed_backend(monkeypatch, tmp_path):
    """The interpreter's Triton backend made to time its candidates, as a GPU's does, with a cache directory
    of its own."""
    from ember.codegen.triton.backend import TritonBackend
    monkeypatch.setattr(TritonBackend, "tunes", property(lambda self: True))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))


def _swiglu_residual(x, wg, wu, r):
    gate = x @ wg
    return F.silu(gate) * (x @ wu) + r, gate


def test_autotuning_chooses_a_candidate_that_runs(timed_backend, monkeypatch):
    """Candidates are timed at the first call; one that fails is dropped, the choice is remembered."""
    broken = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 1, "num_stages": 1,
              "NO_SUCH_PARAMETER": 1}
    real_candidates, real_tune = TemplateChoice.candidates, TemplateChoice._tune
    chosen = []

    def tune(self, args, cands):
        assert broken in cands
        best = real_tune(self, args, cands)
        chosen.append(best)
        return best
    # the interpreter has one tile per product: a broken one makes two candidates
    monkeypatch.setattr(TemplateChoice, "candidates", lambda self: [broken] + real_candidates(self))
    monkeypatch.setattr(TemplateChoice, "_tune", tune)
    x, wg, wu, r = _rand(24, 40), _rand(40, 32), _rand(40, 32), _rand(24, 32)
    _compile(_swiglu_residual, x, wg, wu, r, mode="always")
    assert chosen and broken not in chosen


def test_the_first_call_binds_the_chosen_launch():
    """After its first call a TemplateChoice launches the chosen candidate through a function bound with
    its grid: later calls neither choose nor work out the grid again."""
    from ember.runtime.template_choice import TemplateTuning
    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **cfg: launched.append((grid, args, cfg["BLOCK_M"]))
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16}
    choice = TemplateChoice(Kernel(), TemplateTuning([cfg], (2, 64, 48, 8), [0]), "src")
    choice.run("a", "b")
    assert "run" in vars(choice) and choice.chosen == cfg
    choice.grid = None          # a second call that worked out the grid would fail here
    choice.run("c", "d")
    assert launched == [((3,), ("a", "b"), 32), ((3,), ("c", "d"), 32)]     # 3 programs: INTERPRETED_PROGRAMS


def test_the_bound_launch_is_the_launchers_hot_path(monkeypatch):
    """ember's Launcher replaces its `launch` with a hot path at its first launch: the launch a TemplateChoice
    binds after its first call must be that one, not the first-launch path (which builds a hot path again at
    every call)."""
    from ember.runtime import template_choice
    from ember.runtime.template_choice import TemplateTuning
    calls = []

    class Launcher:
        def launch(self, grid, args, meta):
            calls.append("first")
            self.launch = lambda grid, args, meta: calls.append("hot")
    monkeypatch.setattr(template_choice, "Launcher", Launcher)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16}
    choice = TemplateChoice(Launcher(), TemplateTuning([cfg], (1, 64, 48, 8), [0]), "src")
    for _ in range(3):
        choice.run("a")
    assert calls == ["first", "hot", "hot"]


# -- products decomposed along K (decompose_k) ---------------------------------------------------------------

def _decomposed(sources, splits: int) -> tuple:
    """(the batched template over K's slices, the kernel summing them): the graph's only two kernels."""
    templates = _templates(sources)
    assert len(templates) == 1 and len(sources) == 2, sources
    (template,) = templates
    (summing,) = [s for s in sources if s is not template]
    assert f"# bmm: [{splits}]" in template and "tl.sum(" in summing
    return template, summing


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_decomposed_product_with_bias_and_gelu(dtype):
    """A long-K linear layer (K = 512 >= 8 x max(M, N)) with bias and GELU: the slices' float32 products are
    stored by one batched template, their sum runs the bias and GELU before the one store of the result
    (rounded once to bfloat16)."""
    x, w, b = _rand(24, 512, dtype=dtype) * 0.3, _rand(20, 512, dtype=dtype) * 0.3, _rand(20, dtype=dtype)
    with ember.config.patch(decompose_k="always"):
        _, sources = _compile(lambda x, w, b: (F.gelu(F.linear(x, w, b)),), x, w, b)
    template, summing = _decomposed(sources, 8)
    assert "tl.store(out_ptr0 + (xindex), acc, xmask)" in template     # float32 partials, not rounded
    assert "erf" in summing and summing.count("tl.store(") == 1


def test_decomposed_product_of_strided_operands_and_odd_sizes():
    """M and N primes, a read transposed (a column-major view), b a row-major matrix; a residual added."""
    at, b, r = _rand(384, 13), _rand(384, 7), _rand(13, 7)
    with ember.config.patch(decompose_k="always"):
        _, sources = _compile(lambda at, b, r: (at.t() @ b + r,), at, b, r)
    _decomposed(sources, 4)         # 384 = 4 slices of 96 (the middle of 2, 4 and 8)


def test_decomposed_product_of_a_slice_along_k():
    """a is columns 100..483 of a wider matrix: its slices start at an offset into the storage."""
    wide, b = _rand(13, 600), _rand(384, 7)
    with ember.config.patch(decompose_k="always"):
        _, sources = _compile(lambda wide, b: (wide[:, 100:484] @ b,), wide, b)
    _decomposed(sources, 4)


def test_decompose_k_leaves_short_k_and_batched_products_alone():
    """K under 8 x max(M, N), and every bmm: the template as it is, one kernel with its epilogue."""
    a, b, x, y = _rand(24, 96), _rand(96, 20), _rand(2, 8, 256), _rand(2, 256, 8)
    with ember.config.patch(decompose_k="always"):
        _, sources = _compile(lambda a, b, x, y: ((a @ b).relu(), (x @ y).relu()), a, b, x, y)
    assert len(_only_templates(sources, 2)) == 2 and not any("tl.sum(" in s for s in sources)


def test_decompose_k_never_keeps_one_template():
    x, w = _rand(24, 512), _rand(512, 20)
    with ember.config.patch(decompose_k="never"):
        _, sources = _compile(lambda x, w: ((x @ w).relu(),), x, w)
    _only_templates(sources, 1)


def test_decomposed_weight_gradient_trains_as_eager():
    """A linear layer over 512 rows: the weight's gradient (K = 512 rows) is decomposed along K, the input's
    is not; gradients as eager's."""
    model = torch.nn.Linear(16, 8).to(DEVICE)
    x = _rand(512, 16).requires_grad_()
    with ember.config.patch(gemm_templates="always", decompose_k="always"):
        check(lambda x: model(x).tanh(), x, grad=True)
    assert not any("mm" in op for op in ember.metrics.fallbacks) and ember.metrics.decomposed_products == 1


# -- 1x1 convolutions of channels-last inputs ---------------------------------------------------------------

def _channels_last(*shape, dtype=torch.float32):
    return _rand(*shape, dtype=dtype).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_pointwise_convolution_with_bias_and_relu_is_one_kernel(dtype):
    """A 1x1 convolution of a channels-last input is the template's product of the input's [N*H*W, C_in]
    rows and the weight's transpose; its bias and ReLU run on the tile, and the one store is the channels-last
    result. H and W are primes."""
    x, w, b = _channels_last(2, 24, 5, 7, dtype=dtype), _rand(20, 24, 1, 1, dtype=dtype), _rand(20, dtype=dtype)
    with ember.config.patch(conv_layout="channels_last"):
        out, sources = _compile(lambda x, w, b: (F.relu(F.conv2d(x, w, b)),), x, w, b)
    (src,) = _only_templates(sources, 1)
    assert "# mm: [1] x [70, 24] @ [24, 20]" in src and src.count("tl.store(") == 1
    assert out[0].is_contiguous(memory_format=torch.channels_last)
    assert "aten.convolution.default" not in ember.metrics.fallbacks


class _Bottleneck(torch.nn.Module):
    """ResNet's bottleneck: 1x1, 3x3, 1x1 convolutions, each with BatchNorm; ReLUs and the residual."""

    def __init__(self, width: int, inner: int):
        super().__init__()
        conv, norm = torch.nn.Conv2d, torch.nn.BatchNorm2d
        self.c1, self.n1 = conv(width, inner, 1, bias=False), norm(inner)
        self.c2, self.n2 = conv(inner, inner, 3, padding=1, bias=False), norm(inner)
        self.c3, self.n3 = conv(inner, width, 1, bias=False), norm(width)
        for n in (self.n1, self.n2, self.n3):
            n.running_mean.normal_()
            n.running_var.uniform_(0.5, 2.0)
            n.weight.data.normal_()
            n.bias.data.normal_()

    def forward(self, x):
        y = torch.relu(self.n1(self.c1(x)))
        y = torch.relu(self.n2(self.c2(y)))
        return torch.relu(self.n3(self.c3(y)) + x)


def test_bottleneck_inference_fuses_norms_relus_and_the_residual_into_its_1x1_convolutions():
    """In inference the 1x1 convolutions carry their BatchNorm and ReLU (and the last one the residual) on the
    tile; the 3x3 convolution stays the library's."""
    model = _Bottleneck(32, 16).eval().to(DEVICE)
    x = _channels_last(2, 32, 5, 7)
    with torch.no_grad(), ember.config.patch(gemm_templates="always", conv_layout="channels_last"):
        check(model, x)
    assert ember.metrics.template_kernels == 2 and ember.metrics.fused_epilogue_nodes >= 2
    assert ember.metrics.fallbacks["aten.convolution.default"] == 1


def test_bottleneck_trains_as_eager_with_templates_for_its_1x1_convolutions():
    """In training the 1x1 convolutions' products are templates (their BatchNorm's statistics read them,
    so they are stored); the backward's convolutions are the library's; output, gradients and running
    statistics as eager's (a copy of the model: eager's BatchNorm saves the running statistics, which the
    compiled step updates)."""
    import copy
    model = _Bottleneck(32, 16).train().to(DEVICE)
    reference = copy.deepcopy(model)
    x = _channels_last(2, 32, 5, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    torch._dynamo.reset()
    with ember.config.patch(gemm_templates="always", conv_layout="channels_last"):
        out = torch.compile(model, backend="ember")(xs[0])
        out.pow(2).sum().backward()
    expected = reference(xs[1])
    expected.pow(2).sum().backward()
    assert_close(out, expected)
    # float32 gradients summed over 70 positions in another order: 1e-4
    assert_close([xs[0].grad, *(p.grad for p in model.parameters()), *model.buffers()],
                 [xs[1].grad, *(p.grad for p in reference.parameters()), *reference.buffers()], 1e-4, 1e-4)
    assert ember.metrics.template_kernels >= 2


def test_other_convolutions_stay_library_calls():
    """Strided or grouped 1x1 convolutions, larger kernels, and a 1x1 convolution of an NCHW input (no
    layout plan) are ATen calls."""
    x, w, wg, w3 = _channels_last(2, 24, 6, 6), _rand(20, 24, 1, 1), _rand(20, 12, 1, 1), _rand(20, 24, 3, 3)

    def f(x, w, wg, w3):
        return (F.conv2d(x, w, stride=2), F.conv2d(x, wg, groups=2), F.conv2d(x, w3))
    with ember.config.patch(conv_layout="channels_last"):
        _compile(f, x, w, wg, w3)
    assert ember.metrics.template_kernels == 0 and ember.metrics.fallbacks["aten.convolution.default"] == 3
    ember.metrics.reset()
    with ember.config.patch(conv_layout="as_traced"):
        _compile(lambda x, w: (F.conv2d(x, w),), x.contiguous(), w)
    assert ember.metrics.template_kernels == 0 and ember.metrics.fallbacks["aten.convolution.default"] == 1


# -- prologues: an operand cast on its tile ------------------------------------------------------------------

def test_a_weight_cast_to_bf16_is_read_in_float32_and_cast_on_the_tile():
    """x @ w.to(bf16).t() (autocast's cast of a float32 weight): the template reads the float32 weight where
    it is, transposed, and rounds its tile to bfloat16; no kernel writes the cast weight."""
    x, w, b = _rand(24, 40, dtype=BF16), _rand(48, 40), _rand(48)
    out, sources = _compile(lambda x, w, b: (F.gelu(x @ w.to(BF16).t() + b.to(BF16)),), x, w, b)
    (src,) = _only_templates(sources, 1)
    assert "b = b.to(tl.bfloat16)" in src and out[0].dtype == BF16


def test_a_cast_weight_in_a_row_vector_product_and_a_decomposed_one():
    """The row-vector loop rounds the cast operand to bfloat16 before its float32 products; a product
    decomposed along K casts the slices' tiles."""
    x, w, xl, wl = _rand(1, 40, dtype=BF16), _rand(48, 40), _rand(16, 512, dtype=BF16), _rand(512, 20)
    out, sources = _compile(lambda x, w: ((x @ w.to(BF16).t()).relu(),), x, w)
    (src,) = _only_templates(sources, 1)
    assert "# mv:" in src and ".to(tl.bfloat16).to(tl.float32)" in src
    with ember.config.patch(decompose_k="always"):
        _, sources = _compile(lambda x, w: (x @ w.to(BF16),), xl, wl)
    template, _ = _decomposed(sources, 8)
    assert "b = b.to(tl.bfloat16)" in template


def test_a_cast_read_by_two_products_and_kept():
    """A cast weight that is also returned is stored once; each product reads it or its source, correctly."""
    x, w = _rand(24, 40, dtype=BF16), _rand(48, 40)

    def f(x, w):
        wb = w.to(BF16)
        return (x @ wb.t()).relu(), (x @ wb.t()).sigmoid(), wb
    _compile(f, x, w)


def test_linear_under_autocast_trains_as_eager():
    """A float32 linear layer under CPU autocast (bfloat16): the forward's and backward's products take the
    weight's cast on their tiles where nothing else keeps it; gradients as eager's."""
    if DEVICE != "cpu":
        pytest.skip("CPU autocast")
    model = torch.nn.Linear(40, 24)
    x = _rand(32, 40).requires_grad_()

    def step(x):
        with torch.autocast("cpu", dtype=BF16):
            return model(x).float().tanh()
    with ember.config.patch(gemm_templates="always"):
        check(step, x, grad=True, rtol=2e-2, atol=2e-2)
    assert not any("mm" in op for op in ember.metrics.fallbacks)


@pytest.mark.parametrize("tf32", [False, True])
def test_float32_products_multiply_in_tf32_as_the_eager_op_would(tf32):
    """A float32 1x1 convolution's template multiplies in TF32 where cuDNN's would (torch.backends.cudnn's
    allow_tf32, on by default); a float32 matrix product where torch.backends.cuda.matmul's allow_tf32 says."""
    x, w, a, b = _channels_last(2, 24, 5, 7), _rand(20, 24, 1, 1), _rand(64, 40), _rand(40, 48)
    c, m = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = m.allow_tf32
    try:
        m.allow_tf32 = not tf32
        with c.flags(enabled=c.enabled, benchmark=c.benchmark, deterministic=c.deterministic, allow_tf32=tf32), \
                ember.config.patch(gemm_templates="always", graph_cache=False, conv_layout="channels_last"):
            fn = lambda x, w, a, b: (F.conv2d(x, w), a @ b)  # noqa: E731
            compiled = ember.compile_graph(make_fx(fn)(x, w, a, b), [x, w, a, b])
            out = compiled([x, w, a, b])
            expected = fn(x, w, a, b)
    finally:
        m.allow_tf32 = saved
    assert_close(tuple(out), expected, rtol=1e-2, atol=1e-2)      # TF32: 10 bits of mantissa
    conv, mm = sorted(_only_templates([gen.source for gen in compiled.kernels], 2), key=lambda s: "[64, 40]" in s)
    assert "[70, 24] @ [24, 20]" in conv and "[64, 40] @ [40, 48]" in mm
    assert ('input_precision="tf32"' in conv) == tf32 and ('input_precision="tf32"' in mm) == (not tf32)


def test_a_pointwise_convolution_of_one_pixel_takes_the_row_vector_loop(monkeypatch):
    """A squeeze-and-excitation block's 1x1 convolutions on one pooled pixel of one image are row-vector
    products: where the backend prefers its row-vector template (a GPU's rule, patched in here), the default
    mode lowers them so, bias and sigmoid on the tile."""
    from ember.codegen.triton.backend import TritonBackend
    monkeypatch.setattr(TritonBackend, "prefers_template", lambda self, spec: spec.sizes()[1] == 1)
    x = _channels_last(1, 40, 1, 1)
    w, b = _rand(24, 40, 1, 1), _rand(24)
    with ember.config.patch(conv_layout="channels_last"):
        _, sources = _compile(lambda x, w, b: (torch.sigmoid(F.conv2d(x, w, b)),), x, w, b, mode="matvec")
    (src,) = _only_templates(sources, 1)
    assert "# mv:" in src
