"""Each matrix product's kernel chosen before lowering (gemm_templates="auto", which mode="max-autotune"
sets): the products a graph states, the decision rule, the probe kernels that time the template (run here
through Triton's interpreter against torch), and the choices applied to lowering, against eager."""
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.codegen.triton import product_choice
from ember.codegen.triton.gemm_template import template_configs
from ember.ir.template import ProductSpec
from ember.lowering.matmul import product_spec
from ember.testing import assert_close

DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
needs_triton = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("EMBER_CPU_BACKEND") != "triton",
                                  reason="Triton code: run with EMBER_CPU_BACKEND=triton")
F = torch.nn.functional
aten = torch.ops.aten


def _rand(*shape, dtype=torch.float32):
    return (torch.randn(*shape) * 0.4).to(dtype=dtype, device=DEVICE)


def _specs(fn, *args, tracing_mode="real") -> list:
    gm = make_fx(fn, tracing_mode=tracing_mode)(*args)
    return [(n.target, product_spec(n)) for n in gm.graph.nodes
            if n.target in (aten.mm.default, aten.bmm.default, aten.addmm.default)]


def test_a_graph_states_its_products_and_what_an_epilogue_would_save():
    def f(x, w, w2, g, r):
        h = F.gelu((x @ w.t()).view(2, 12, 32))    # read by GELU through a view only: the product is never stored
        p = x @ w2                                  # read by relu and returned: stored anyway
        q = torch.bmm(g, r)                         # returned as it is: nothing to fuse
        return h, p.relu(), p, q
    x, w, w2, g, r = _rand(24, 40), _rand(32, 40), _rand(40, 16), _rand(3, 5, 7), _rand(3, 7, 9)
    (t1, s1), (t2, s2), (t3, s3) = _specs(f, x, w, w2, g, r)
    assert (t1, t2, t3) == (aten.mm.default, aten.mm.default, aten.bmm.default)
    assert s1 == ProductSpec("mm", ((24, 40), (40, 1)), ((40, 32), (1, 40)), None, torch.float32, 1.0, ("gelu",))
    assert (s2.op, s2.epilogue_share, s2.sizes()) == ("mm", 0.5, (1, 24, 16, 40))
    assert (s3.op, s3.epilogue_share, s3.sizes()) == ("bmm", 0.0, (3, 5, 9, 7))


def test_products_the_template_does_not_cover_have_no_spec():
    ints = torch.randint(0, 5, (4, 6)), torch.randint(0, 5, (6, 3))
    assert _specs(lambda a, b: a @ b, *ints) == [(aten.mm.default, None)]
    [(_, spec)] = _specs(lambda a, b: a @ b, _rand(4, 6), _rand(6, 3), tracing_mode="symbolic")
    assert spec is None
    [(_, spec)] = _specs(lambda c, a, b: torch.addmm(c, a, b), _rand(3), _rand(4, 6), _rand(6, 3))
    assert spec.op == "addmm" and spec.bias == ((3,), (1,)) and spec.epilogue == ("load_row",)


def test_an_epilogue_sketch_follows_the_pointwise_chain():
    """What a fused epilogue would load and compute: a bias row, a residual of the product's size, GELU."""
    def f(x, w, b, r):
        return r + F.gelu(x @ w + b, approximate="tanh") * 2
    [(_, spec)] = _specs(f, _rand(8, 4), _rand(4, 6), _rand(6), _rand(8, 6))
    assert spec.epilogue == ("load_row", "gelu_tanh", "load_full") and spec.epilogue_share == 1.0


def test_the_template_must_beat_the_library_plus_the_saved_epilogue():
    a, b = {"BLOCK_M": 64}, {"BLOCK_M": 128}
    assert product_choice.decide([(1.0, a), (0.8, b)], 1.0, 0.0) == b
    assert product_choice.decide([(0.99, a)], 1.0, 0.0) is None          # a near-tie keeps the library
    assert product_choice.decide([(1.1, a)], 1.0, 0.3) == a              # the fused epilogue pays
    assert product_choice.decide([], 1.0, 5.0) is None                   # no config ran


@needs_triton
@pytest.mark.parametrize("op,a,b,dtype", [
    ("mm", ((17, 13), (13, 1)), ((13, 23), (1, 13)), torch.float32),      # transposed b, primes
    ("mm", ((1, 40), (40, 1)), ((40, 1), (1, 1)), torch.bfloat16),        # M = N = 1
    ("bmm", ((3, 9, 20), (180, 20, 1)), ((3, 20, 11), (1, 3, 60)), torch.float32),   # permuted b
])
def test_probe_kernels_compute_the_product(op, a, b, dtype):
    _check_probe(ProductSpec(op, a, b, None, dtype, 0.0))


@needs_triton
def test_probe_kernels_compute_the_sketched_epilogue():
    """The probe's epilogue: a residual of the product's size and a bias row added, then tanh."""
    spec = ProductSpec("mm", ((17, 13), (13, 1)), ((13, 23), (23, 1)), None, torch.float32, 1.0,
                       ("load_full", "load_row", "tanh", "add"))
    _check_probe(spec, lambda p, full, row: torch.tanh(p + full.view(p.shape) + row))


def test_probe_kernels_compute_gelu_with_the_kernels_erf():
    """Exact GELU's sketch is the erf generated kernels call (ember's helper), after a bias row."""
    spec = ProductSpec("mm", ((17, 13), (13, 1)), ((13, 23), (23, 1)), None, torch.float32, 1.0,
                       ("load_row", "gelu"))
    _check_probe(spec, lambda p, row: torch.erf(p + row))


def test_probe_kernels_compute_tanh_gelus_spelling():
    """Tanh-GELU's sketch is what its lowering generates: v / (1 + exp(-2v)) on the tile (the cost of the exp
    and the division; the probe feeds it the product itself)."""
    spec = ProductSpec("mm", ((17, 13), (13, 1)), ((13, 23), (23, 1)), None, torch.float32, 1.0, ("gelu_tanh",))
    _check_probe(spec, lambda p: p / (1 + torch.exp(-2 * p)))


def _check_probe(spec, epilogue=lambda p, *inputs: p):
    interpreted = DEVICE == "cpu"
    mod = product_choice.load_probes(product_choice.module_header(interpreted) +
                                     product_choice.probe_source(spec, "probe", interpreted))
    x, y = product_choice._operand(spec.a, spec.dtype, DEVICE), product_choice._operand(spec.b, spec.dtype, DEVICE)
    inputs = product_choice._epilogue_inputs(spec, DEVICE)
    batch, m, n, _ = spec.sizes()
    out = torch.empty((batch, m, n) if spec.op == "bmm" else (m, n), dtype=spec.dtype, device=DEVICE)
    ref = epilogue((torch.bmm if spec.op == "bmm" else torch.mm)(x.float(), y.float()), *[t.float() for t in inputs])
    for cfg in template_configs(spec.sizes(), spec.dtype, interpreted):
        out.fill_(float("nan"))
        mod.probe[(-(-m // cfg["BLOCK_M"]) * -(-n // cfg["BLOCK_N"]), batch)](x, y, out, *inputs, **cfg)
        bf16 = spec.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref, rtol=2e-2 if bf16 else 1e-4, atol=1e-3)


@pytest.fixture
def timed_backend(monkeypatch, tmp_path):
    """The interpreter's Triton backend made to time, as a GPU's does, with a cache directory of its own."""
    from ember.codegen.triton.backend import TritonBackend
    monkeypatch.setattr(TritonBackend, "tunes", property(lambda self: True))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))


@needs_triton
def test_choices_are_timed_once_and_kept_on_disk(timed_backend, monkeypatch):
    spec = ProductSpec("mm", ((8, 12), (12, 1)), ((12, 8), (8, 1)), None, torch.float32, 1.0)
    dev = torch.device(DEVICE)
    timed = []
    real_median = product_choice.median_ms
    monkeypatch.setattr(product_choice, "median_ms", lambda launch, **kw: timed.append(1) or real_median(launch, **kw))
    first = product_choice.choose_products([spec, spec], dev, interpreted=DEVICE == "cpu")
    configs = template_configs(spec.sizes(), spec.dtype, DEVICE == "cpu")
    assert list(first) == [spec] and len(timed) == len(configs) + 2     # the probe's configs, library, copy
    chosen = first[spec]
    assert chosen is None or chosen in template_configs(spec.sizes(), spec.dtype, DEVICE == "cpu")
    monkeypatch.setattr(product_choice, "_time_all", lambda *a: pytest.fail("timed again"))
    assert product_choice.choose_products([spec], dev, interpreted=DEVICE == "cpu") == first


def _swiglu_residual(x, wg, wu, w, r):
    gate, up = x @ wg, x @ wu             # read by the SwiGLU only
    down = (F.silu(gate) * up) @ w + r    # read by an add
    return down, x @ w.t(), r.t() @ x     # the last two: returned as they are


@needs_triton
def test_auto_lowers_each_product_as_chosen(timed_backend, monkeypatch):
    """A product whose choice is the template becomes a template kernel with that config and its epilogue
    fused; one whose choice is the library is an ATen call, as with "never"."""
    asked = []

    def time_all(specs, device, interpreted):
        asked.extend(specs)
        return {s: (template_configs(s.sizes(), s.dtype, interpreted)[0] if s.epilogue_share else None)
                for s in specs}
    monkeypatch.setattr(product_choice, "_time_all", time_all)
    args = _rand(24, 40), _rand(40, 32), _rand(40, 32), _rand(32, 40), _rand(24, 40)
    for _ in range(2):                    # the second compile reads every choice from disk
        ember.metrics.reset()
        with ember.config.patch(gemm_templates="auto", graph_cache=False):
            compiled = ember.compile_graph(make_fx(_swiglu_residual)(*args), list(args))
            assert_close(tuple(compiled(list(args))), tuple(_swiglu_residual(*args)))
        assert ember.metrics.template_kernels == 3 and ember.metrics.fallbacks["aten.mm.default"] == 2
        assert len(asked) == 5, asked     # five products, timed once


@needs_triton
def test_max_autotune_times_the_products_of_forward_and_backward(timed_backend, monkeypatch):
    from ember.codegen.triton.backend import TritonBackend
    asked = []

    def choose(self, specs, device):
        asked.append([s.sizes() for s in specs])
        return {s: None for s in specs}
    monkeypatch.setattr(TritonBackend, "choose_products", choose)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(DEVICE)
    x = _rand(24, 40)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ember", mode="max-autotune-no-cudagraphs")
    compiled(x).pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).pow(2).sum().backward()
    assert_close(grads, [p.grad for p in model.parameters()])
    assert len(asked) == 2 and (1, 24, 32, 40) in asked[0] and (1, 32, 40, 24) in asked[1], asked
    assert ember.config.gemm_templates == "matvec"      # the mode's setting held only while compiling


# -- decompositions along K ---------------------------------------------------------------------------------

def test_long_k_products_time_their_decompositions_along_k(monkeypatch):
    """Split counts: none for K under 8 x max(M, N); slices a multiple of 16 and at least 256 deep. The
    choice times at most SPLIT_CANDIDATES of them, the most slices first, whose tiles fill between a quarter
    of the device's programs and four waves of them; none for a bmm, none with decompose_k other than auto."""
    from ember.ir.template import split_k_counts
    assert split_k_counts(256, 256, 65536) == [2, 4, 8, 16, 32, 64]
    assert split_k_counts(256, 256, 2040) == []             # K < 8 x 256
    assert split_k_counts(128, 64, 1536) == [2, 4]          # 768 and 384 deep; 192 is too shallow
    assert split_k_counts(16, 16, 1000) == []               # no slice a multiple of 16
    monkeypatch.setattr(product_choice, "max_programs", lambda device: 132)
    split_k = ProductSpec("mm", ((256, 65536), (65536, 1)), ((65536, 256), (1, 65536)), None, torch.bfloat16, 0.0)
    assert product_choice._split_counts(split_k, torch.device(DEVICE)) == [64, 32, 16]    # 4 tiles each
    weight_grad = ProductSpec("mm", ((1024, 8192), (1, 1024)), ((8192, 1024), (1024, 1)), None, torch.bfloat16, 0.0)
    assert product_choice._split_counts(weight_grad, torch.device(DEVICE)) == [8, 4, 2]   # 64 tiles each
    batched = ProductSpec("bmm", ((2, 256, 65536), (256 * 65536, 65536, 1)), ((2, 65536, 256), (65536 * 256, 256, 1)),
                          None, torch.bfloat16, 0.0)
    assert product_choice._split_counts(batched, torch.device(DEVICE)) == []
    with ember.config.patch(decompose_k="never"):
        assert product_choice._split_counts(split_k, torch.device(DEVICE)) == []


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_probe_stores_each_slices_float32_product(dtype):
    """The probe of a decomposition (split_spec) reads the product's operands in place, slice s of K for
    batch entry s, and stores each slice's product in float32; their sum is the product."""
    spec = ProductSpec("mm", ((13, 96), (96, 1)), ((96, 7), (1, 96)), None, dtype, 0.0)    # b transposed
    split = product_choice.split_spec(spec, 3)
    interpreted = DEVICE == "cpu"
    mod = product_choice.load_probes(product_choice.module_header(interpreted) +
                                     product_choice.probe_source(split, "probe", interpreted, torch.float32))
    x, y = product_choice._operand(spec.a, dtype, DEVICE), product_choice._operand(spec.b, dtype, DEVICE)
    xs, ys = x.as_strided(*split.a), y.as_strided(*split.b)
    out = torch.full((3, 13, 7), float("nan"), device=DEVICE)
    for cfg in template_configs(split.sizes(), dtype, interpreted, True):
        mod.probe[(3 * -(-13 // cfg["BLOCK_M"]) * -(-7 // cfg["BLOCK_N"]),)](xs, ys, out, **cfg)
        slices = torch.stack([x[:, 32 * s:32 * (s + 1)].float() @ y[32 * s:32 * (s + 1)].float() for s in range(3)])
        torch.testing.assert_close(out, slices, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.sum(0), x.float() @ y.float(), rtol=1e-4, atol=1e-4)


@needs_triton
def test_a_long_k_product_times_the_template_its_decompositions_and_the_library(timed_backend, monkeypatch):
    """choose_products on a product of K = 8 x 256: its own probe's configs, the library call, and for each
    of three split counts the partials' sum and the batched probe's configs are timed (each launch run once
    here, its time given); the choice is the fastest decomposition, with its config and split count."""
    spec = ProductSpec("mm", ((16, 2048), (2048, 1)), ((2048, 16), (1, 2048)), None, torch.float32, 0.0)
    interpreted = DEVICE == "cpu"
    configs = len(template_configs(spec.sizes(), spec.dtype, interpreted))
    split_configs = min(product_choice.SPLIT_CONFIGS,
                        len(template_configs((8, 16, 16, 256), spec.dtype, interpreted, True)))
    # own configs, library; then per split count (8, 4, 2): the sum, its configs
    times = [1.0] * configs + [1.0] + [0.05] + [0.3] * split_configs + [0.05] + [0.2] * split_configs + \
        [0.05] + [0.4] * split_configs
    timed = []

    def median_ms(launch, **kw):
        launch()
        timed.append(times[len(timed)])
        return timed[-1]
    monkeypatch.setattr(product_choice, "median_ms", median_ms)
    monkeypatch.setattr(product_choice, "max_programs", lambda device: 8)
    assert product_choice._split_counts(spec, torch.device(DEVICE)) == [8, 4, 2]
    choice = product_choice.choose_products([spec], torch.device(DEVICE), interpreted)[spec]
    assert len(timed) == len(times)
    assert choice["decompose_k"] == 4 and "BLOCK_K" in choice


@needs_triton
def test_auto_lowers_a_product_chosen_decomposed(timed_backend, monkeypatch):
    """A choice with decompose_k lowers as the batched template over that many slices (with the choice's
    config) and the partials' sum, which carries the epilogue; results as eager's."""
    def time_all(specs, device, interpreted):
        return {s: {**template_configs(product_choice.split_spec(s, 4).sizes(), s.dtype, interpreted, True)[0],
                    "decompose_k": 4} for s in specs}
    monkeypatch.setattr(product_choice, "_time_all", time_all)
    x, w, r = _rand(12, 640), _rand(640, 20), _rand(12, 20)
    with ember.config.patch(gemm_templates="auto", graph_cache=False):
        compiled = ember.compile_graph(make_fx(lambda x, w, r: ((x @ w) * 2 + r,))(x, w, r), [x, w, r])
        assert_close(tuple(compiled([x, w, r])), ((x @ w) * 2 + r,))
    sources = [gen.source for gen in compiled.kernels]
    assert ember.metrics.decomposed_products == 1 and len(sources) == 2
    assert any("# bmm: [4] x [12, 160] @ [160, 20]" in s for s in sources)


@needs_triton
def test_epilogues_times_only_products_with_a_costly_epilogue(timed_backend, monkeypatch):
    """gemm_templates="epilogues": of an MLP's products, only the one whose readers run GELU is timed (and
    lowered as chosen); the residual one stays the library call untimed. max-autotune widens it to "auto"."""
    asked = []

    def time_all(specs, device, interpreted):
        asked.extend(specs)
        return {s: template_configs(s.sizes(), s.dtype, interpreted)[0] for s in specs}
    monkeypatch.setattr(product_choice, "_time_all", time_all)

    def mlp(x, w1, b1, w2):
        return (F.linear(F.gelu(F.linear(x, w1, b1)), w2) + x,)
    args = _rand(24, 16), _rand(40, 16), _rand(40), _rand(16, 40)
    with ember.config.patch(gemm_templates="epilogues", graph_cache=False):
        compiled = ember.compile_graph(make_fx(mlp)(*args), list(args))
        assert_close(tuple(compiled(list(args))), mlp(*args))
    assert [s.epilogue for s in asked] == [("load_row", "gelu")]
    assert ember.metrics.template_kernels == 1 and ember.metrics.fallbacks["aten.mm.default"] == 1
    from ember.dynamo import ember_backend
    seen = []
    monkeypatch.setattr("ember.dynamo._compile_dynamo_graph", lambda gm, ex, cg, settings: seen.append(settings))
    with ember.config.patch(gemm_templates="epilogues"):
        ember_backend(make_fx(mlp)(*args), list(args), mode="max-autotune-no-cudagraphs")
    assert seen == [{"gemm_templates": "auto"}]


# -- 1x1 convolutions ---------------------------------------------------------------------------------------

def _conv_graph(x, w, b):
    def f(x, w, b):
        return (F.gelu(F.conv2d(x, w, b)),)
    return make_fx(f)(x, w, b)


@pytest.mark.usefixtures("exact_float32_convolutions")
def test_a_pointwise_convolution_states_its_product():
    """A 1x1 convolution of a channels-last input: the product of its [N*H*W, C_in] rows and its weight's
    transpose, the bias a row its epilogue loads; the library call is the convolution itself, which
    computes that product."""
    x = _rand(2, 24, 5, 7).contiguous(memory_format=torch.channels_last)
    w, b = _rand(20, 24, 1, 1), _rand(20)
    (spec,) = [product_spec(n) for n in _conv_graph(x, w, b).graph.nodes if product_spec(n) is not None]
    assert spec.op == "conv1x1" and spec.sizes() == (1, 70, 20, 24)
    assert spec.a == ((70, 24), (24, 1)) and spec.b == ((24, 20), (1, 24)) and spec.bias == ((20,), (1,))
    assert spec.epilogue == ("load_row", "gelu") and spec.epilogue_share == 1.0
    dev = torch.device(DEVICE)
    torch.manual_seed(3)
    out = product_choice._library_call(spec, None, None, dev)()
    torch.manual_seed(3)
    xs, ws = (product_choice._operand(o, spec.dtype, dev) for o in spec.conv)
    bias = product_choice._operand(spec.bias, spec.dtype, dev)
    rows = xs.permute(0, 2, 3, 1).reshape(70, 24)
    assert_close(out.permute(0, 2, 3, 1).reshape(70, 20), rows @ ws.view(20, 24).t() + bias)
    # an NCHW input, a 3x3 kernel: no product
    assert not any(product_spec(n) for n in _conv_graph(x.contiguous(), w, b).graph.nodes)
    assert not any(product_spec(n) for n in make_fx(lambda x, w: F.conv2d(x, w))(x, _rand(20, 24, 3, 3)).graph.nodes)


@needs_triton
@pytest.mark.usefixtures("exact_float32_convolutions")
def test_auto_lowers_a_pointwise_convolution_chosen_as_a_template(timed_backend, monkeypatch):
    """A 1x1 convolution timed faster as the template is one kernel with its bias and GELU; one timed
    slower stays the library's convolution."""
    for chosen in (True, False):
        def time_all(specs, device, interpreted):
            return {s: template_configs(s.sizes(), s.dtype, interpreted)[0] if chosen else None for s in specs}
        monkeypatch.setattr(product_choice, "_time_all", time_all)
        ember.metrics.reset()
        x = _rand(2, 24, 5, 7).contiguous(memory_format=torch.channels_last)
        out_channels = 20 if chosen else 18          # another product: the first choice is kept on disk
        w, b = _rand(out_channels, 24, 1, 1), _rand(out_channels)
        with ember.config.patch(gemm_templates="auto", graph_cache=False, conv_layout="channels_last"):
            compiled = ember.compile_graph(_conv_graph(x, w, b), [x, w, b])
            assert_close(tuple(compiled([x, w, b])), (F.gelu(F.conv2d(x, w, b)),))
        assert ember.metrics.template_kernels == int(chosen)
        assert ember.metrics.fallbacks["aten.convolution.default"] == int(not chosen)


def test_epilogues_times_a_pointwise_convolution_with_a_pointwise_reader(monkeypatch):
    """gemm_templates="epilogues" times a 1x1 convolution read by a ReLU (its fused BatchNorm and ReLU are
    what the library's convolution cannot take), not one whose output is only returned."""
    from ember.lowering import matmul
    x = _rand(2, 24, 5, 7).contiguous(memory_format=torch.channels_last)
    w = _rand(20, 24, 1, 1)
    read = [product_spec(n) for n in make_fx(lambda x, w: F.conv2d(x, w).relu())(x, w).graph.nodes]
    returned = [product_spec(n) for n in make_fx(lambda x, w: F.conv2d(x, w))(x, w).graph.nodes]
    (read,), (returned,) = [s for s in read if s], [s for s in returned if s]
    with ember.config.patch(gemm_templates="epilogues"):
        assert matmul._worth_timing(read) and not matmul._worth_timing(returned)
