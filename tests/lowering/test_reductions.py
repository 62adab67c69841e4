"""Reduction lowerings (ember/lowering/reductions.py) against eager: every reduction over one dim, several
dims, all dims, keepdim, negative dims, non-contiguous inputs, long (looped) rows, integer/bool/half
inputs, NaNs and ties."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import check, lowered

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64, BOOL = torch.int32, torch.int64, torch.bool

# rows longer than this are reduced in a loop rather than held whole
# rows past one persistent block, of an odd length: never split into chunks (split reductions divide rows evenly)
LOOPED = ember.config.persistent_reduction_max + 1001


# dims argument, keepdim
DIMS = [((1,), False), ((1,), True), ((0,), False), ((-1,), True), ((-2,), False), ((0, 2), False),
        ((0, -1), True), ((-3, -2, -1), False), (None, False), (None, True)]
DIM_IDS = [f"{d}-{'keep' if k else 'drop'}" for d, k in DIMS]


def _kw(dims, keepdim):
    return {"keepdim": keepdim} if dims is None else {"dim": dims, "keepdim": keepdim}


# name -> fn(x, dims, keepdim)
def _sum(x, d, k):
    return x.sum() if d is None and not k else torch.sum(x, d if d is not None else (0, 1, 2), keepdim=k)


def _mean(x, d, k):
    return x.mean() if d is None and not k else torch.mean(x, d if d is not None else (0, 1, 2), keepdim=k)


def _amax(x, d, k):
    return torch.amax(x, d if d is not None else (), keepdim=k)


def _amin(x, d, k):
    return torch.amin(x, d if d is not None else (), keepdim=k)


def _var(c):
    return lambda x, d, k: torch.var(x, d, correction=c, keepdim=k)


def _std(c):
    return lambda x, d, k: torch.std(x, d, correction=c, keepdim=k)


def _var_mean(c):
    return lambda x, d, k: torch.var_mean(x, d, correction=c, keepdim=k)


def _std_mean(c):
    return lambda x, d, k: torch.std_mean(x, d, correction=c, keepdim=k)


def _any(x, d, k):
    return x.any() if d is None and not k else torch.any(x, d if d is not None else (0, 1, 2), keepdim=k)


def _all(x, d, k):
    return x.all() if d is None and not k else torch.all(x, d if d is not None else (0, 1, 2), keepdim=k)


MULTI_DIM = {"sum": _sum, "mean": _mean, "amax": _amax, "amin": _amin, "var0": _var(0), "var1": _var(1),
             "std0": _std(0), "std1": _std(1), "var_mean0": _var_mean(0), "var_mean1": _var_mean(1),
             "std_mean0": _std_mean(0), "std_mean1": _std_mean(1)}


@pytest.mark.parametrize("dims,keepdim", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("name", list(MULTI_DIM))
def test_multi_dim_reductions(device, name, dims, keepdim):
    fn = MULTI_DIM[name]
    lowered(lambda a: fn(a, dims, keepdim), torch.randn(3, 5, 7, device=device))


@pytest.mark.parametrize("dims,keepdim", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all(device, name, dims, keepdim):
    fn = {"any": _any, "all": _all}[name]
    b = torch.rand(3, 5, 7, device=device) > 0.3     # mixed rows: some all-true, some not
    b[0] = True
    b[1] = False
    f = torch.randn(3, 5, 7, device=device).round()   # zeros and non-zeros
    i = torch.randint(-1, 2, (3, 5, 7), device=device)
    u = torch.randint(0, 3, (3, 5, 7), dtype=torch.uint8, device=device)     # the result stays uint8, as eager's
    lowered(lambda *xs: tuple(fn(x, dims, keepdim) for x in xs), b, f, i, u)


@pytest.mark.parametrize("length", [40, LOOPED])
def test_a_uint8_sum_wraps_as_eager(device, length):
    """A sum with dtype=uint8 wraps modulo 256 (accumulated as uint8), also when a second reader takes the
    result, and over long (looped) rows."""
    u = torch.randint(0, 256, (6, length), dtype=torch.uint8, device=device)
    b = torch.randint(0, 2, (6, 8), dtype=torch.uint8, device=device)
    lowered(lambda x, y: (torch.sum(x, 1, dtype=torch.uint8), (s := torch.sum(y, 1, dtype=torch.uint8)), s >> 1,
                          torch.sum(x, 1)), u, b)


SINGLE_DIM = {
    "prod": lambda x, d, k: torch.prod(x, d, keepdim=k),
    "max_dim": lambda x, d, k: torch.max(x, d, keepdim=k),
    "min_dim": lambda x, d, k: torch.min(x, d, keepdim=k),
    "argmax": lambda x, d, k: torch.argmax(x, d, keepdim=k),
    "argmin": lambda x, d, k: torch.argmin(x, d, keepdim=k),
}


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (2, False), (-1, False), (-2, True)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("name", list(SINGLE_DIM))
def test_single_dim_reductions(device, name, dim, keepdim):
    fn = SINGLE_DIM[name]
    x = torch.randn(3, 5, 7, device=device)
    if name == "prod":
        x = x.abs() * 0.5 + 0.75     # keep the products in range
    lowered(lambda a: fn(a, dim, keepdim), x)


@pytest.mark.parametrize("name", ["prod", "argmax", "argmin", "max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_all_dims_single_dim_ops(device, name, keepdim):
    x = torch.randn(4, 6, device=device)
    fns = {"prod": lambda a: torch.prod(a * 0.3 + 1), "argmax": lambda a: torch.argmax(a, keepdim=keepdim),
           "argmin": lambda a: torch.argmin(a, keepdim=keepdim), "max": torch.max, "min": torch.min}
    if name in ("prod", "max", "min") and keepdim:
        pytest.skip("no keepdim form")
    lowered(fns[name], x)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "var1", "std_mean0"])
def test_non_contiguous_input(device, name):
    fn = MULTI_DIM[name]
    x = torch.randn(6, 5, 8, device=device)
    lowered(lambda a: (fn(a.permute(2, 0, 1), (1,), False), fn(a.transpose(0, 2)[:, ::2], (0, 2), True)), x)


@pytest.mark.parametrize("name", ["sum", "argmax", "max_dim", "var_mean1"])
def test_non_contiguous_graph_input(device, name):
    x = torch.randn(8, 6, device=device).t()[:, 1:]     # strides (1, 6), offset 6
    fns = {"sum": lambda a: a.sum(1), "argmax": lambda a: a.argmax(0), "max_dim": lambda a: a.max(1),
           "var_mean1": lambda a: torch.var_mean(a, 1)}
    lowered(fns[name], x)


def test_reduction_of_computed_and_consumed(device):
    x, y = torch.randn(6, 33, device=device), torch.randn(6, 33, device=device)
    lowered(lambda a, b: ((a * b).sum(1, keepdim=True) * a - (a + b).amax(0), (a - b).var(1) + 1), x, y)


# --- long rows ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "var1", "std_mean0"])
def test_looped_rows(device, name):
    fn = MULTI_DIM[name]
    lowered(lambda a: fn(a, (1,), False), torch.randn(3, LOOPED, device=device))


@pytest.mark.parametrize("name", ["prod", "argmax", "argmin", "max_dim", "min_dim"])
def test_looped_rows_single_dim(device, name):
    x = torch.randn(2, LOOPED, device=device)
    if name == "prod":
        x = 1 + x * 1e-3
    lowered(lambda a: SINGLE_DIM[name](a, 1, False), x)


def test_looped_rows_of_whole_chunks(device):
    # rows a multiple of every chunk size: no chunk of the loop is partial
    n = 2 * ember.config.persistent_reduction_max
    x = torch.randn(3, n, device=device)
    x[1, n - 1] = float("nan")
    x[2, n - 5] = float("inf")
    lowered(lambda a: (a.sum(1), torch.var_mean(a, 1), a.argmax(1), torch.ops.ember.softmax_stats(a, 1)), x)


def test_looped_rows_any_all(device):
    b = torch.rand(3, LOOPED, device=device) > 0.001
    b[0] = True
    lowered(lambda x: (x.any(1), x.all(1), (~x).any(1), (~x).all(1)), b)


def test_looped_rows_over_several_dims(device):
    x = torch.randn(2, 150, 130, device=device)       # rows of 19500 over dims (1, 2)
    lowered(lambda a: (a.sum((1, 2)), torch.var_mean(a, (1, 2)), a.amax((-1, -2), keepdim=True)), x)


def test_looped_argmax_ties_and_nan(device):
    x = torch.randint(0, 3, (2, LOOPED), device=device).float()   # many ties at the max
    x[1, 12345] = float("nan")
    x[1, 17000] = float("nan")
    lowered(lambda a: (a.argmax(1), a.argmin(1), a.max(1), a.amax(1)), x)


def test_looped_softmax_like(device):
    lowered(lambda a: (a - a.amax(1, keepdim=True)).exp() / (a - a.amax(1, keepdim=True)).exp().sum(1, keepdim=True),
            torch.randn(2, LOOPED, device=device))


def test_few_very_long_rows(device):
    # few rows of many elements: may reduce in two steps (max/any split reductions are kept out: they
    # take minutes in the Triton interpreter)
    x = torch.randn(2, 140000, device=device)
    lowered(lambda a: (a.sum(1), a.mean(1, keepdim=True)), x, rtol=1e-4, atol=1e-4)


def test_few_columns_of_many_rows_reduce_in_two_kernels(device):
    # a LayerNorm weight's gradient: 96 sums along the strided dim of a (4096, 96) matrix. One kernel would
    # run 96 / XBLOCK programs; split, the first kernel writes (8, 96) partials read along the contiguous dim.
    # The three sums share their rows, so they fuse into one kernel per step.
    # (The C++ backend reads columns in blocks of 64 per thread and never splits: one kernel.)
    x, y = torch.randn(4096, 96, device=device), torch.randn(4096, 96, device=device)
    lowered(lambda a, b: ((a * b).sum(0), (a + b).sum(0), b.sum(0, keepdim=True)), x, y, rtol=1e-4, atol=1e-4)
    assert ember.metrics.generated_kernel_count == (1 if _cpp(device) else 2)


def test_a_bias_gradient_sums_its_columns_in_chunks_of_at_most_256_rows(device):
    """A bias gradient over 2048 tokens and 768 columns: 8 partial rows of 256 per column (chunks of 512,
    the row reductions' minimum, left the GPU 1.7x slower than chunks of 256), then the partials' sum.
    A row reduction of the same sizes is split in chunks of 512 (on a GPU: 768 rows are too few programs).
    The C++ backend splits neither: a thread per 64 columns or per row."""
    from ember.lowering.reductions import _split_count
    gpu = torch.device("cuda")        # the policy is asked by device; no GPU is needed to ask
    assert _split_count([768], [2048], "sum", gpu, strided=True) == 8
    assert _split_count([768], [2048], "sum", gpu) == 4
    assert _split_count([4096], [768], "sum", gpu) == 1
    g = torch.randn(2048, 768, device=device)
    lowered(lambda a: a.view(4, 512, 768).sum([0, 1]), g, rtol=1e-4, atol=1e-3)
    assert ember.metrics.generated_kernel_count == (1 if _cpp(device) else 2)


def test_argmax_of_a_long_row_is_split_and_keeps_the_first_extreme(device):
    """A greedy decoder's argmax over 32000 logits is split in 32 chunks on a GPU: the chunks' extremes and
    their indices in one kernel, then the winning chunk's. Ties and NaN give eager's first index (checked on
    rows of 8192, 16 chunks of 512: the interpreter is slow)."""
    from ember.lowering.reductions import _split_count
    assert _split_count([1], [32000], "argmax", torch.device("cuda")) == 32
    assert _split_count([2], [8192], "argmax", torch.device("cuda")) == 16
    x = torch.randn(2, 8192, device=device)
    x[0, 2000] = x[0, 5000] = 10.0
    x[1, 1111] = x[1, 7000] = float("nan")
    lowered(lambda a: (a.argmax(-1), a.argmin(-1, keepdim=True), a.argmax()), x)
    lowered(lambda a: a[:, 64:].argmin(-1), x)          # 8128 = 2^6 * 127 per row: chunks of 1016


def _cpp(device) -> bool:
    return device == "cpu" and ember.config.cpu_backend == "cpp"


def _triton_interpreter(device) -> bool:
    return device == "cpu" and ember.config.cpu_backend == "triton"


@pytest.mark.parametrize("shape", [(4096, 1024), (2048, 2048)])
def test_layer_norm_and_softmax_over_a_thousand_rows_or_more_are_one_kernel_each(device, shape):
    """Rows enough to fill a GPU (and a CPU's threads) are not split into partial reductions: split, a
    LayerNorm over 4096 rows of 1024 ran as three kernels and (C++ backend) a softmax over 2048 rows of
    2048 as five, reading their input twice (1.3x inductor's time on the CPU where one kernel is 0.75x).
    Triton computes softmax's statistics as one online reduction, which is never split; the interpreter
    takes minutes over its rows, so the CPU's Triton run checks the LayerNorm only."""
    from ember.lowering.reductions import _split_count
    for dev in (torch.device("cuda"), torch.device("cpu")):
        assert _split_count([shape[0]], [shape[1]], "sum", dev) == 1
    x, w, b = (torch.randn(shape, device=device), torch.randn(shape[1], device=device),
               torch.randn(shape[1], device=device))
    fns = [lambda x: F.layer_norm(x, (shape[1],), w, b)]
    if not _triton_interpreter(device):
        fns.append(lambda x: torch.softmax(x, -1))
    for fn in fns:
        ember.metrics.reset()
        check(fn, x, rtol=1e-4, atol=1e-4)
        assert ember.metrics.generated_kernel_count == 1


def test_variance_of_few_long_rows_combines_chunk_statistics(device):
    # a BatchNorm's statistics over N*H*W for 8 channels: Welford over chunks of each row, then the chunk
    # means and m2s combined (reductions._split_welford); a nan still gives nan. (No inf: eager's own mean
    # of a row holding an inf is inf or nan depending on where its vectorized Welford meets it.)
    y = torch.randn(32, 8, 32, 32, device=device) * 3 + 5
    y[7, 5, 1, 1] = float("nan")
    lowered(lambda a: (torch.var_mean(a, [0, 2, 3], keepdim=True), a.std(), torch.var_mean(a[:, :2], [0, 2, 3])),
            y, rtol=1e-4, atol=1e-4)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    lowered(lambda a, w, b: F.batch_norm(a * 2 + 1, None, None, w, b, training=True),
            torch.randn(32, 8, 32, 32, device=device), w, b, grad=True, rtol=1e-4, atol=1e-4)


def test_single_long_row_all_dims(device):
    # one looped row of an odd length: not split (a split max takes minutes in the interpreter)
    x = torch.randn(199, 301, device=device)
    lowered(lambda a: (a.sum(), a.amax(), a.mean(), a.std(), a.argmax()), x, rtol=1e-4, atol=1e-4)


# --- dtypes ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [I32, I64, BOOL])
def test_integer_and_bool_inputs(device, dtype):
    if dtype == BOOL:
        x = torch.rand(4, 9, device=device) > 0.5
    else:
        x = torch.randint(-50, 50, (4, 9), device=device, dtype=dtype)
    lowered(lambda a: (a.sum(1), a.sum(), torch.amax(a, 0), torch.amin(a, 1), a.max(1), a.min(0),
                       a.any(1), a.all(0), a.prod(1)), x)
    if dtype != BOOL:    # eager has no argmax of bool
        lowered(lambda a: (a.argmax(1), a.argmin(0), a.argmax()), x)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_integer_prod_and_sum_dtype(device, dtype):
    x = torch.randint(-3, 4, (4, 9), device=device, dtype=dtype)
    lowered(lambda a: (a.prod(1), a.sum(0, dtype=torch.float32), a.sum(1, dtype=torch.int32),
                       a.mean(1, dtype=torch.float32), a.float().mean(0)), x)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_batch_norm_with_update_running_stats(device, dtype):
    """aten._batch_norm_with_update updates its running statistics in place. Its functional form's meta
    function says float32 statistics for 16-bit inputs while the CPU kernel returns 16-bit ones: decomposed
    (as every other batch norm), and compared with eager after the call, outputs and statistics."""
    def f(x, w, b, rm, rv):
        return torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.3, 1e-5)[0]
    x = torch.randn(6, 5, 7, device=device, dtype=dtype) * 2 + 1
    w, b = torch.randn(5, device=device, dtype=dtype), torch.randn(5, device=device, dtype=dtype)
    rm, rv = torch.randn(5, device=device, dtype=dtype), torch.rand(5, device=device, dtype=dtype) + 0.5
    eager = [t.clone() for t in (rm, rv)]
    expected = f(x, w, b, *eager)
    mine = [t.clone() for t in (rm, rv)]
    actual = torch.compile(f, backend="ember")(x, w, b, *mine)
    ember.testing.assert_close(actual, expected)
    ember.testing.assert_close(mine, eager, what="running statistics")
    assert not ember.metrics.fallbacks, dict(ember.metrics.fallbacks)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_half_inputs(device, dtype):
    x = torch.randn(5, 300, device=device, dtype=dtype)
    lowered(lambda a: (a.sum(1), a.mean(1), a.amax(1), a.amin(0), a.max(1), a.argmax(0), torch.var_mean(a, 1),
                       torch.std(a, 0), a.sum(1, dtype=torch.float32), a.prod(0)), x)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_half_sum_accumulates_in_float32(device, dtype):
    # a float16 accumulator would lose the small terms
    x = torch.cat([torch.full((1, 1), 2048.0), torch.ones(1, 3000)], 1).to(device=device, dtype=dtype)
    lowered(lambda a: (a.sum(1), a.mean(1)), x)


def test_float64(device):
    x = torch.randn(5, 40, device=device, dtype=F64)
    lowered(lambda a: (a.sum(1), a.mean(0), a.amax(1), torch.var_mean(a, 1), a.argmin(1), a.std(0, correction=0)), x)


# --- NaN, inf, ties ------------------------------------------------------------------------------------------

def _with_nans(device):
    x = torch.randn(4, 10, device=device)
    x[0, 3] = float("nan")
    x[1, 0] = float("nan")
    x[1, 7] = float("nan")
    x[2, 9] = float("nan")
    return x


def test_amax_amin_nan(device):
    lowered(lambda a: (a.amax(1), a.amin(1), a.amax(0), a.amax(), a.max(), a.min()), _with_nans(device))


def test_argmax_argmin_nan(device):
    # the first NaN wins, as in eager
    lowered(lambda a: (a.argmax(1), a.argmin(1), a.argmax(0), a.argmax(), a.max(1), a.min(1)), _with_nans(device))


def test_inf(device):
    x = torch.randn(4, 10, device=device)
    x[0, 2] = float("inf")
    x[1, 5] = -float("inf")
    x[2] = -float("inf")
    lowered(lambda a: (a.amax(1), a.amin(1), a.argmax(1), a.argmin(1), a.sum(1)), x)


def test_argmax_ties_first_index(device):
    x = torch.randint(0, 3, (6, 50), device=device).float()
    lowered(lambda a: (a.argmax(1), a.argmin(1), a.argmax(0), a.max(1), a.min(0), a.argmax()), x)


def test_argmax_ties_int(device):
    x = torch.randint(0, 2, (6, 50), device=device)
    lowered(lambda a: (a.argmax(1), a.argmin(1), a.max(1), a.argmax()), x)


def test_max_dim_ties_bool(device):
    x = torch.rand(6, 50, device=device) > 0.5
    x[0] = False
    x[1] = True
    lowered(lambda a: (a.max(1), a.min(1), a.max(0)), x)


def test_sum_with_nan(device):
    lowered(lambda a: (a.sum(1), a.mean(1), torch.var_mean(a, 1)), _with_nans(device))


# --- edge sizes -----------------------------------------------------------------------------------------------

def test_reduce_size_one_dims(device):
    x = torch.randn(1, 5, 1, device=device)
    lowered(lambda a: (a.sum(0), a.sum(2, keepdim=True), a.amax((0, 2)), a.argmax(1), torch.var(a, 1), a.mean(0)), x)


def test_var_of_single_element_rows(device):
    # n - correction == 0: eager gives nan for correction 1, 0 for correction 0
    x = torch.randn(4, 1, device=device)
    lowered(lambda a: (torch.var(a, 1), torch.var(a, 1, correction=0), torch.std_mean(a, 1)), x)


def test_var_large_correction(device):
    x = torch.randn(4, 6, device=device)
    lowered(lambda a: (torch.var(a, 1, correction=2), torch.std(a, 1, correction=5), torch.var(a, 1, correction=0.5)), x)


def test_reduce_zero_dim_tensor(device):
    x = torch.tensor(1.5, device=device)
    check(lambda a: (a.sum(), a.amax(), a.argmax(), a.mean(), a.prod()), x)


def test_empty_reduction(device):
    x = torch.randn(3, 0, device=device)
    check(lambda a: (a.sum(1), a.prod(1), a.any(1), a.all(1), a.mean(0), a.mean(1), torch.var_mean(a, 1),
                     torch.std_mean(a, 1, correction=0)), x)


# --- gradients --------------------------------------------------------------------------------------------------

def test_reduction_grads(device):
    x = torch.randn(4, 6, 5, device=device)
    check(lambda a: a.sum(1).sin().sum() + a.mean((0, 2)).exp().sum() + a.amax(-1).sum() + a.var(1).sum()
          + torch.std_mean(a, 0, correction=0)[0].sum() + a.max(1).values.sum(), x, grad=True)


def test_prod_grad(device):
    x = torch.rand(4, 6, device=device) + 0.5
    check(lambda a: a.prod(1), x, grad=True)


def test_looped_grad(device):
    x = torch.randn(2, LOOPED, device=device)
    check(lambda a: (a.softmax(1) * a).sum(1), x, grad=True)


def test_codegen_reduction_over_one_element(device, monkeypatch):
    # the lowering no longer builds reductions over one element (reductions.reduce makes them pointwise);
    # codegen must still handle one built directly
    import sympy
    from ember.ir.nodes import Reduction, TensorBox
    from ember.lowering import registry

    def raw_sum(x, dims, keepdim=False, *, dtype=None):
        loader = x.make_loader()
        box = TensorBox(Reduction(x.device, x.dtype, lambda idx, ridx: loader([idx[0], ridx[0]]),
                                  [x.get_size()[0]], [sympy.Integer(1)], "sum", x.dtype))
        box.realize()
        return box
    registry.load_all()
    monkeypatch.setitem(registry.lowerings, torch.ops.aten.sum.dim_IntList, raw_sum)
    check(lambda a: a.sum(1), torch.randn(4, 1, device=device))


# --- softmax's row statistics (graph/passes/post_grad.online_softmax_stats) ----------------------------------

def _post_grad_ops(seen):
    def record(gm):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
    return record


@pytest.mark.parametrize("n", [37, LOOPED])
def test_softmax_statistics_are_one_reduction(device, n):
    # the max and the sum of exp of a row come from one reduction: a looped row is read once (online)
    import torch.nn.functional as F
    seen = []
    x = torch.randn(5, n, device=device) * 4
    t = torch.randint(0, n, (5,), device=device)
    with ember.config.patch(post_grad_passes=[_post_grad_ops(seen)]):
        lowered(lambda a, b: (F.log_softmax(a, -1), F.softmax(a, 1), F.cross_entropy(a, b)), x, t, grad=True)
    from ember.device import backend_for
    online = backend_for(device).reads_rows_online
    assert (torch.ops.ember.softmax_stats.default in seen) == online
    assert (torch.ops.aten.amax.default in seen) != online


@pytest.mark.parametrize("n", [37, LOOPED])
def test_softmax_statistics_special_values(device, n):
    # -inf adds nothing; +inf or nan in a row make it nan; a row of only -inf is nan (as eager computes)
    import torch.nn.functional as F
    y = torch.randn(7, n, device=device) * 3
    y[0] = float("-inf")
    y[1, 3] = float("-inf")
    y[2, 7] = float("inf")
    y[3, 1] = float("nan")
    y[4, :n - 1] = float("-inf")
    y[5, ::2] = float("inf")
    y[5, 1] = float("nan")                  # nan and +inf in one row: a nan max, as eager's amax
    y[6, n - 1] = float("-inf")
    lowered(lambda a: (F.log_softmax(a, -1), F.softmax(a, -1)), y)


@pytest.mark.parametrize("n", [1, 37, LOOPED])
def test_softmax_stats_op_on_every_backend(device, n):
    # ember::softmax_stats lowers on every backend, whether or not the post-grad pass makes it there
    y = torch.randn(7, n, device=device) * 3
    y[0] = float("-inf")
    y[1, 0] = float("-inf")
    y[2, n // 2] = float("inf")
    y[3, n - 1] = float("nan")
    y[5, :n - 1] = float("-inf")
    lowered(lambda a: torch.ops.ember.softmax_stats(a, 1), y)
    lowered(lambda a: torch.ops.ember.softmax_stats(a, 0), y.double())


def test_softmax_statistics_of_upcast_and_double_rows(device):
    import torch.nn.functional as F
    x = torch.randn(4, LOOPED, device=device, dtype=BF16)
    t = torch.randint(0, LOOPED, (4,), device=device)
    lowered(lambda a, b: F.cross_entropy(a.float(), b), x, t)
    lowered(lambda a: F.log_softmax(a, 0), torch.randn(LOOPED, 3, device=device, dtype=F64), grad=True)


def test_a_layer_norm_over_many_short_rows_is_one_kernel(device):
    """GPT-2's and BERT's LayerNorm, 4096 rows of 768: enough rows to fill a GPU, so the statistics are
    not split into partial reductions (with 128-element chunks allowed they were: three kernels per
    LayerNorm, GPT-2 inference 41 -> 104 kernels)."""
    x, w, b = torch.randn(4096, 768, device=device), torch.randn(768, device=device), torch.randn(768, device=device)
    ember.metrics.reset()
    check(lambda x: F.layer_norm(x, (768,), w, b), x, rtol=1e-4, atol=1e-4)
    assert ember.metrics.generated_kernel_count == 1
