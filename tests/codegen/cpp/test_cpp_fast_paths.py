"""The C++ backend's fast paths (ember/codegen/cpp/): rows for pointwise kernels over broadcast or permuted
inputs, inlined erf/exp, row buffers for values a later row loop would recompute, lane combines, tiled
transposes. Each is checked against eager, and against its generated source for what it is there for."""
import glob
import os
import re
import tempfile

import pytest
import torch
import torch.nn.functional as F
import ember
from ember.testing import check

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def sources(fn, *args, backward=False) -> str:
    """The C++ source of the kernels ember generates for fn(*args) (from the EMBER_DEBUG dump); backward:
    of the backward graph only, fn's output summed and differentiated with respect to every argument."""
    with tempfile.TemporaryDirectory() as d, ember.config.patch(debug=True, debug_dir=d):
        torch._dynamo.reset()
        if backward:
            torch.compile(fn, backend="ember")(*(a.clone().requires_grad_() for a in args)).sum().backward()
        else:
            torch.compile(fn, backend="ember")(*args)
        graphs = "*backward*" if backward else "*"
        return "\n".join(open(p).read() for p in glob.glob(os.path.join(d, graphs, "kernels.cpp")))


def simd_lines(src: str) -> list[str]:
    """The statements inside the innermost (SIMD) loops."""
    out, depth = [], None
    for line in src.splitlines():
        if "#pragma omp simd" in line:
            depth = 0
            continue
        if depth is not None:
            depth += line.count("{") - line.count("}")
            out.append(line)
            if depth <= 0 and "}" in line:
                depth = None
    return out


# --- pointwise kernels as rows ------------------------------------------------------------------------------

def test_broadcast_operand_is_read_contiguously():
    x, b = torch.randn(37, 96), torch.randn(96)
    check(lambda a, c: F.gelu(a + c), x, b)
    src = sources(lambda a, c: F.gelu(a + c), x, b)
    assert "in_ptr1[rindex]" in src
    assert not any("%" in ln for ln in simd_lines(src)), src


def test_per_row_values_are_computed_once_per_row():
    x, s = torch.randn(50, 64), torch.randn(50, 1)
    check(lambda a, c: a * c.exp() + c, x, s)
    src = sources(lambda a, c: a * c.exp() + c, x, s)
    assert "exp_" in src and not any("exp_" in ln for ln in simd_lines(src)), src


def test_values_of_no_element_are_computed_once_before_the_loop():
    """A flat kernel's values computed from 0-d inputs alone (an optimizer's bias corrections from its step
    count) come before the threads' loop, once: no pow in the SIMD loop."""
    x, step = torch.randn(4099), torch.tensor(3.0)

    def fn(a, t):
        return a / (1 - torch.pow(0.999, t + 1)).sqrt() + torch.pow(0.9, t)
    check(fn, x, step)
    src = sources(fn, x, step)
    assert "std::pow" in src and not any("pow" in ln or "sqrt" in ln for ln in simd_lines(src)), src
    check(fn, x[:0], step)                 # an empty kernel reads nothing


@pytest.mark.parametrize("shape", [(2, 16, 96), (3, 5, 48)])
def test_attention_head_split_and_merge(shape):
    B, T, D3 = shape
    x = torch.randn(B, T, D3)

    def heads(a):
        q, k, v = a.view(B, T, 3, 4, D3 // 12).permute(2, 0, 3, 1, 4).unbind(0)
        return q * 2, k.transpose(-2, -1) + 1, v.transpose(1, 2).reshape(B, T, D3 // 3) - 1
    check(heads, x)


@pytest.mark.parametrize("shape", [(3, 17, 19), (4, 32, 24)])
def test_permuted_copies(shape):
    x = torch.randn(shape)
    check(lambda a: a.permute(1, 0, 2).contiguous() * 3, x)
    check(lambda a: a.permute(2, 0, 1) + a.permute(2, 0, 1).sin(), x)


def test_rows_with_dynamic_shapes():
    f = torch.compile(lambda a, c: (a + c) * c.sigmoid(), backend="ember", dynamic=True)
    for n, m in ((40, 48), (70, 80)):
        x, b = torch.randn(n, m), torch.randn(m)
        torch.testing.assert_close(f(x, b), (x + b) * b.sigmoid())


# --- erf / exp / sigmoid --------------------------------------------------------------------------------------

def _ulp_error(out: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """|out - ref| in units of the float32 spacing at ref; 0 where both are the same inf or NaN."""
    ref = ref64.float()
    ulp = (torch.nextafter(ref.abs(), torch.tensor(float("inf"))) - ref.abs()).double()
    err = (out.double() - ref64).abs() / ulp
    same = (torch.isnan(ref) & torch.isnan(out)) | (torch.isinf(ref) & (out == ref))
    return torch.where(same, torch.zeros_like(err), err)


def test_erf_and_exp_are_accurate_over_the_float_range():
    grid = torch.cat([torch.linspace(-6, 6, 200_001), torch.linspace(-110, 95, 100_001),
                      torch.logspace(-30, 1, 20_001), -torch.logspace(-30, 1, 20_001)]).float()
    f = torch.compile(lambda a: (torch.erf(a), torch.exp(a), torch.sigmoid(a)), backend="ember")
    erf, exp, sig = f(grid)
    g = grid.double()
    assert _ulp_error(erf, torch.erf(g)).max() <= 3
    assert _ulp_error(exp, torch.exp(g)).max() <= 1.5
    torch.testing.assert_close(sig, torch.sigmoid(g).float(), rtol=1e-6, atol=1e-7)


def test_erf_and_exp_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 89.0, -105.0, 88.7, -87.5, 4.5, -4.5])
    erf, exp = torch.compile(lambda a: (torch.erf(a), torch.exp(a)), backend="ember")(x)
    torch.testing.assert_close(erf, torch.erf(x), equal_nan=True, rtol=0, atol=0)
    assert torch.signbit(erf[1]) and not torch.signbit(erf[0])
    torch.testing.assert_close(exp, torch.exp(x.double()).float(), equal_nan=True, rtol=2e-7, atol=0)


def test_float64_erf_and_exp_keep_double_precision():
    x = torch.randn(1000, dtype=F64) * 3
    check(lambda a: (torch.erf(a), torch.exp(a)), x)


# --- reductions ------------------------------------------------------------------------------------------------

def test_softmax_keeps_exp_in_a_row_buffer():
    x = torch.randn(6, 3000)
    check(lambda a: torch.softmax(a, -1), x)
    assert "ember_row0" in sources(lambda a: torch.softmax(a, -1), x)
    check(lambda a: torch.log_softmax(a * 2, -1), x, grad=True)


@pytest.mark.parametrize("n", [200, 5000])
def test_lane_combines(n):
    x = torch.randn(7, n)
    x[1, n // 3] = float("nan")
    x[2, n - 1] = float("nan")
    x[3, 5] = x[3, n // 2] = 50.0                   # ties: argmax takes the first
    check(lambda a: (a.sum(-1), a.amax(-1), a.amin(-1), a.argmax(-1), a.argmin(-1), a.prod(-1).abs().log1p(),
                     a.var(-1), (a > 2.5).any(-1), (a > -4).all(-1)), x)
    i = torch.randint(-1000, 1000, (5, n))
    check(lambda a: (a.sum(-1), a.amax(-1), a.amin(-1)), i)
    check(lambda a: (a.sum(-1), a.amax(-1)), x.double())


def test_layer_norm_weight_gradients_read_the_activations_along_their_rows():
    """The weight and bias gradients of a LayerNorm are column sums over tokens that also read each token's
    mean and rstd: those per-token vectors must not outvote the activations, or the sums vectorize along
    the tokens and gather every element at a stride (4096 x 1024 fwd+bwd: 13.4 ms, inductor 2.9)."""
    def loss(x, w, b):
        return F.layer_norm(x, (96,), w, b).square().sum()
    args = (torch.randn(256, 96), torch.randn(96), torch.randn(96))
    check(loss, *args, grad=True, rtol=1e-4, atol=1e-4)
    src = sources(loss, *args, backward=True)
    lines = src.splitlines()
    loops = [lines[i + 1] for i, ln in enumerate(lines) if "#pragma omp simd" in ln]
    strided = [lp for lp, body in zip(loops, src.split("#pragma omp simd")[1:]) if "96*rindex + xindex]" in body.split("}")[0]]
    assert strided and all("int64_t xl" in lp for lp in strided), src


def test_masked_softmax_rows():
    s = torch.randn(4, 2, 128, 128)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    check(lambda a: torch.softmax(a.masked_fill(~mask, float("-inf")), -1), s)


# --- tiled transposes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16, torch.int32])
@pytest.mark.parametrize("shape", [(45, 70), (64, 48)])
def test_transpose_tiles_with_edges(dtype, shape):
    x = torch.randn(shape).mul(10).to(dtype)
    y = torch.randn(shape[::-1]).mul(10).to(dtype)
    check(lambda a, b: a.t() + b, x, y)


def test_transpose_stages_float_tiles_as_blocks():
    x, y = torch.randn(48, 40), torch.randn(40, 48)
    src = sources(lambda a, b: a.t() * 2 + b, x, y)
    assert "ember::transpose_block(" in src
    assert re.search(r"if \(xn == \d+ && rn == \d+\)", src)


def test_tiled_kernels_run_on_two_threads():
    x, y = torch.randn(300, 260), torch.randn(260, 300)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        check(lambda a, b: (a.t() + b, F.gelu(a + 1).sum(-1), torch.softmax(b, -1)), x, y)
    finally:
        torch.set_num_threads(old)


def test_independent_nodes_with_different_loops_run_as_separate_nests():
    # attention's split of one qkv buffer: q and v as rows, k^T as tiles, in one kernel function
    B, T, H, Dh = 2, 64, 4, 16
    x = torch.randn(B, T, 3 * H * Dh)

    def split(a):
        q, k, v = a.split(H * Dh, dim=-1)
        q, k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in (q, k, v))
        return q.contiguous() * 1.5, k.transpose(-2, -1).contiguous(), v.contiguous() + 1
    check(split, x)
    src = sources(split, x)
    assert "_part0(" in src and "_part1(" in src and "ember::transpose_block(" in src, src


def _patches(x):
    """x cut into 2x2 patches, a token per patch position (MobileViT's unfolding), sizes ceil(H / 2)."""
    B, C, H, W = x.shape
    nh, nw = -(-H // 2), -(-W // 2)
    y = x.reshape(B * C * nh, 2, nw, 2).transpose(1, 2).reshape(B, C, nh * nw, 4).transpose(1, 3)
    return (y * 2).contiguous()


def test_compound_sizes_are_computed_once_per_kernel():
    """Under dynamic shapes the indices of views of views hold the same compound size expressions over and
    over; each is declared once at the kernel's start (`ks<n>`) and the indices name it. Static kernels
    print their integers as before."""
    with tempfile.TemporaryDirectory() as d, ember.config.patch(debug=True, debug_dir=d):
        torch._dynamo.reset()
        compiled = torch.compile(_patches, backend="ember", dynamic=True)
        for shape in ((2, 3, 8, 12), (3, 2, 12, 6)):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), _patches(x))
        src = "\n".join(open(p).read() for p in glob.glob(os.path.join(d, "*", "kernels.cpp")))
    declared = re.findall(r"const int64_t (ks\d+) = ", src)
    assert declared and len(declared) == len(set(declared)), src
    body = src.split(") {", 1)[1]
    assert all(re.search(rf"\b{k}\b", body.split(f"const int64_t {k} = ", 1)[1]) for k in declared), src
    assert "ks0" not in sources(_patches, torch.randn(2, 3, 8, 12))
