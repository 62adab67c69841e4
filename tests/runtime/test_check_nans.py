"""config.check_nans: the wrapper checks what every kernel and extern call writes, and the first NaN or Inf
raises EmberNanError naming the call, the FX node of the value and the user's source line."""
import re
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.testing import check, fresh_compile


def _pointwise(x):
    y = torch.log(x) * 2
    return y


def _reduction(x):
    s = torch.log(x).sum(1)
    return s


def _scan(x):
    c = torch.cumsum(torch.log(x), 1)
    return c


def _extern(x):
    # an ATen fallback: digamma(0) is -inf
    d = torch.digamma(x)
    return d


def _forced_by_extern(x):
    # y is stored because the extern reads it: its FX node is mul, not the extern's
    y = torch.log(x) * 2
    return torch.digamma(y) + 1


def _two_alike(x, w):
    a = torch.log(x).sum(1)
    # the same kernel as a's, launched again with w's buffers
    b = torch.log(w).sum(1)
    return a, b


def _positive(*shape, device):
    return torch.rand(*shape, device=device) + 0.5


def _with_negative(*shape, device):
    x = _positive(*shape, device=device)
    x[1, 2] = -x[1, 2]
    return x


CASES = [
    # fn, its input, what the error must name: the call, the FX node, the user's source line
    (_pointwise, _with_negative, r"kernel\d+\w*", "mul", "y = torch.log(x) * 2", "NaN"),
    (_reduction, _with_negative, r"kernel\d+\w*", "sum", "s = torch.log(x).sum(1)", "NaN"),
    (_scan, _with_negative, r"kernel\d+\w*", "cumsum", "c = torch.cumsum(torch.log(x), 1)", "NaN"),
    (_extern, None, r"buf\d+ = digamma\.default", "digamma", "d = torch.digamma(x)", "Inf"),
    (_forced_by_extern, _with_negative, r"kernel\d+\w*", "mul", "y = torch.log(x) * 2", "NaN"),
]


def _input(make, device):
    if make is not None:
        return make(4, 8, device=device)
    x = _positive(4, 8, device=device)
    x[2, 3] = 0.0
    return x


def _raised(fn, *args) -> str:
    with ember.config.patch(check_nans=True), pytest.raises(ember.EmberNanError) as info:
        fresh_compile(fn)(*args)
    return str(info.value)


@pytest.mark.parametrize("fn,make,call,node,line,kind", CASES, ids=[c[0].__name__ for c in CASES])
def test_names_the_call_node_and_source_line(fn, make, call, node, line, kind, device):
    msg = _raised(fn, _input(make, device))
    assert re.search(rf"check_nans: {call} \(fx nodes: [^)]*\b{node}(_\d+)?\b", msg), msg
    assert re.search(rf"\(FX node {node}(_\d+)?, from user code: File \"[^\"]*test_check_nans.py\", line \d+, "
                     rf"in {fn.__name__} :: {re.escape(line)}\)", msg), msg
    count = re.search(r"wrote (\d+) NaN and (\d+) Inf", msg)
    nans, infs = int(count.group(1)), int(count.group(2))
    assert (nans, infs) == ((1, 0) if kind == "NaN" else (0, 1)) or (fn is _scan and nans == 6 and infs == 0), msg


@pytest.mark.parametrize("fn,make", [(c[0], c[1]) for c in CASES], ids=[c[0].__name__ for c in CASES])
def test_off_returns_nan_silently(fn, make, device):
    x = _input(make, device)
    out = check(fn, x)              # eager has the NaN or Inf too; compared with equal_nan
    assert not torch.isfinite(out).all()
    source = ember.compile_graph(make_fx(fn)(x), [x]).source
    assert "check_finite" not in source, source


def test_finite_outputs_run_normally(device):
    x = _positive(4, 8, device=device)
    w = _positive(8, 8, device=device)

    def fn(x, w):
        return torch.log(x) * 2, torch.log(x).sum(1), torch.cumsum(x, 1), torch.digamma(x), x @ w

    with ember.config.patch(check_nans=True):
        check(fn, x, w)
        source = ember.compile_graph(make_fx(fn)(x, w), [x, w]).source
    assert source.count("check_finite") >= 3, source      # after the kernels and the extern calls


def test_each_launch_of_a_shared_kernel_names_its_own_values(device):
    for bad in (0, 1):
        args = [_positive(4, 8, device=device) for _ in range(2)]
        args[bad][0, 0] = -1.0
        msg = _raised(_two_alike, *args)
        line = ("a = torch.log(x).sum(1)", "b = torch.log(w).sum(1)")[bad]
        assert line in msg and ("a = ", "b = ")[1 - bad] + "torch" not in msg.split(" to ", 1)[1], msg


def test_nan_error_is_not_turned_into_the_eager_fallback(device):
    x = _with_negative(4, 8, device=device)
    with ember.config.patch(fallback_on_error=True), warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember: the compiled graph failed")   # the eager fallback's
        msg = _raised(_pointwise, x)
    assert "y = torch.log(x) * 2" in msg, msg


def test_graph_inputs_holding_nan_are_not_blamed(device):
    x, y = _positive(4, 8, device=device), _positive(4, 8, device=device)
    x[0, 1] = float("nan")

    def fn(x, y):
        return x.t(), torch.exp(y), x[1:]

    with ember.config.patch(check_nans=True):
        check(fn, x, y)


@pytest.mark.parametrize("fn", [_pointwise, _extern])
def test_nan_from_an_input_is_reported_where_ember_first_writes_it(fn, device):
    x = _positive(4, 8, device=device)
    x[0, 1] = float("nan")
    msg = _raised(fn, x)            # computed from the caller's NaN: reported, saying the input had it
    assert re.search(r"what it read held NaN or Inf already: arg\d+_1$", msg), msg


def test_a_partial_update_in_place_says_the_input_held_nan(device):
    z = _positive(4, 8, device=device)
    z[2, 3] = float("nan")

    def fn(z):
        z[0].mul_(2)                # the new value of all of z is stored before it is copied back
        return z.sum()

    msg = _raised(fn, z)
    assert "what it read held NaN or Inf already: arg0_1" in msg, msg


def _template(x, w):
    # a GEMM template with log in its epilogue: the product's negative entries become NaN in the tile
    t = torch.log(x @ w)
    return t


def test_a_gemm_templates_epilogue_is_named(device):
    from ember.device import backend_for
    if not getattr(backend_for(torch.device(device)), "gemm_templates", False):
        pytest.skip("the kernel backend has no GEMM templates (the Triton backend has)")
    x, w = _positive(16, 32, device=device), torch.randn(32, 24, device=device)
    with ember.config.patch(gemm_templates="always"):
        msg = _raised(_template, x, w)
    assert ember.metrics.template_kernels >= 1
    assert re.search(r"check_nans: kernel\d+\w* \(fx nodes: [^)]*\bmm\b[^)]*\blog\b", msg), msg
    assert re.search(r"in _template :: t = torch\.log\(x @ w\)", msg), msg
    assert int(re.search(r"wrote (\d+) NaN", msg).group(1)) > 0, msg
