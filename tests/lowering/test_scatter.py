"""Scatter lowerings (ember/lowering/scatter.py) against eager: index_put (plain and accumulating, and what
decomposes to it: index_add, index_copy, index_fill, embedding's backward), scatter, scatter_add and
scatter_reduce, with repeated indices, negative indices, other dims, narrow and integer dtypes, gradients,
in-place updates of graph inputs, and the kernels they become (fill, then scatter, then readers)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.ir.nodes import ScatterBuffer
from ember.testing import check, fresh_compile, lowered


def repeated(n, size, device):
    """n indices into range(size), with repeats (and every index at least once where n allows)."""
    idx = torch.randint(0, size, (n,), device=device)
    idx[: min(n, size)] = torch.randperm(size, device=device)[: min(n, size)]
    idx[-1] = idx[0]
    return idx


def distinct_along(dim, index_shape, size, device):
    """An index of index_shape with no repeats along dim (a plain scatter's result is then defined)."""
    keys = torch.rand(*[size if d == dim else n for d, n in enumerate(index_shape)], device=device)
    return keys.argsort(dim=dim).narrow(dim, 0, index_shape[dim])


# --- index_put ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put(device, accumulate):
    x, v = torch.randn(7, 5, device=device), torch.randn(6, 5, device=device)
    i = repeated(6, 7, device) if accumulate else torch.randperm(7, device=device)[:6]
    i[1] = i[1] - 7        # a negative index counts from the end
    lowered(lambda a, b, c: torch.index_put(a * 2, (b,), c.sin(), accumulate=accumulate) + 1, x, i, v)


@pytest.mark.parametrize("case", ["middle", "two", "separated", "broadcast"])
def test_index_put_accumulate_positions(device, case):
    x = torch.randn(4, 6, 5, device=device)
    i, j = repeated(5, 6, device), repeated(5, 5, device)
    put = torch.ops.aten.index_put     # its index list may hold None (a whole dimension); torch.index_put's not
    fn = {"middle": lambda a, p, q, v: put(a, [None, p], v[:4, :, :5].transpose(1, 2)[:, :5], True),
          "two": lambda a, p, q, v: put(a, [None, p, q], v[:4, 0, :5], True),
          "separated": lambda a, p, q, v: put(a, [p % 4, None, q], v[0, :, :6], True),
          "broadcast": lambda a, p, q, v: put(a, [p[:3, None] % 4, q[None, :2]], v[0, 0, :5], True)}[case]
    lowered(fn, x, i, j, torch.randn(5, 5, 6, device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_index_put_accumulate_in_place_16_bit(device, dtype):
    """index_put_ with accumulate and many repeated indices into a 16-bit graph input: eager adds each value
    in turn, rounding to the dtype after each; ember sums in float32 and rounds once, so its values may
    differ from eager's by more than one rounding but each is at least as close to the float64 sum (plus
    one rounding of the dtype)."""
    x = torch.randn(8, 5, device=device, dtype=dtype) * 4
    i, v = repeated(60, 8, device), torch.randn(60, 5, device=device, dtype=dtype) * 4
    put = lambda a, p, w: a.index_put_((p,), w, accumulate=True)   # noqa: E731
    eager, mine = x.clone(), x.clone()
    put(eager, i, v)
    torch.compile(put, backend="ember")(mine, i, v)
    exact = put(x.double(), i, v.double())
    ulp = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7
    bound = (eager.double() - exact).abs() + ulp * exact.abs() + 1e-5
    assert bool(((mine.double() - exact).abs() <= bound).all()), (mine.double() - exact).abs().max()


def test_index_put_broadcast_values(device):
    x, i = torch.randn(6, 3, device=device), repeated(4, 6, device)
    lowered(lambda a, p, v: torch.index_put(a, (p,), v, accumulate=True), x, i, torch.randn(1, 3, device=device))
    lowered(lambda a, p: a.index_put((p,), torch.tensor(2.5, device=device)), x, torch.randperm(6, device=device)[:3])


def test_setitem_and_augmented_setitem(device):
    def f(a, p, v):
        b = a.clone()
        b[p] = v                 # eager drops v's leading size-1 dims
        b[p[:2]] += 1.5
        return b
    x, v = torch.randn(8, 4, device=device), torch.randn(1, 3, 4, device=device)
    lowered(f, x, torch.randperm(8, device=device)[:3], v)


def test_boolean_mask_assignment(device):
    def f(a, m, v):
        b = a * 2
        b[m] = v
        return b
    # the value is a graph input: a constant made in the graph lives on the CPU, which a CUDA kernel
    # cannot load (eager reads it as a scalar; ember runs that as an ATen fallback)
    x, v = torch.randn(6, 5, device=device), torch.tensor(0.5, device=device)
    lowered(f, x, x > 0.3, v)
    lowered(lambda a, m, w: torch.index_put(a, (m,), w, accumulate=True), x, x[:, 0] > 0, v + 0.75)


def test_index_put_mutates_input(device):
    def f(a, p, v):
        a.index_put_((p,), v, accumulate=True)
        return a.sum(0)
    x, p, v = torch.randn(7, 3, device=device), repeated(5, 7, device), torch.randn(5, 3, device=device)
    xe, xa = x.clone(), x.clone()
    expected = f(xe, p, v)
    actual = fresh_compile(f)(xa, p, v)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(xa, xe)
    assert not ember.metrics.fallbacks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_index_put_accumulate_narrow_float(device, dtype):
    x, v = torch.randn(9, 4, device=device, dtype=dtype), torch.randn(12, 4, device=device, dtype=dtype)
    lowered(lambda a, p, b: torch.index_put(a, (p,), b, accumulate=True) * 2, x, repeated(12, 9, device), v)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.bool])
def test_index_put_integer_and_bool(device, dtype):
    x = torch.randint(0, 100, (9, 3), device=device)
    v = torch.randint(50, 120, (7, 3), device=device)     # int8 sums wrap, as in eager
    x, v = (x % 2, v % 2) if dtype == torch.bool else (x, v)
    x, v = x.to(dtype), v.to(dtype)
    lowered(lambda a, p, b: torch.index_put(a, (p,), b, accumulate=True), x, repeated(7, 9, device), v)
    lowered(lambda a, p, b: torch.index_put(a, (p,), b), x, torch.randperm(9, device=device)[:7], v)


def test_many_to_one_along_a_size_one_dim(device):
    """Static store positions (a size-1 dim drops the loaded index) that several elements share: still a
    scatter, never fused with the fill or the readers."""
    x, v = torch.randn(1, 4, device=device), torch.randn(3, 4, device=device)
    p = torch.tensor([0, 0, -1], device=device)
    lowered(lambda a, q, b: torch.index_put(a.exp(), (q,), b, accumulate=True).sin(), x, p, v)
    h = torch.randn((), device=device, dtype=torch.float16)
    lowered(lambda a, p, b: torch.index_add(a, 0, p, b, alpha=-1), h, torch.tensor([0], device=device), h + 1)


# --- what decomposes to index_put -----------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add(device, dim):
    x = torch.randn(5, 6, device=device)
    n = x.shape[dim]
    src = torch.randn(*[8 if d == dim % 2 else s for d, s in enumerate(x.shape)], device=device)
    lowered(lambda a, p, s: torch.index_add(a, dim, p, s, alpha=-0.5), x, repeated(8, n, device), src)


def test_index_copy_and_index_fill(device):
    x = torch.randn(6, 4, device=device)
    lowered(lambda a, p, s: torch.index_copy(a, 1, p, s), x, torch.randperm(4, device=device)[:3],
            torch.randn(6, 3, device=device))
    lowered(lambda a, p: torch.index_fill(a, 0, p, -2.0), x, repeated(5, 6, device))


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_backward(device, padding_idx):
    emb = nn.Embedding(10, 6, padding_idx=padding_idx).to(device)
    ids = repeated(12, 10, device).view(3, 4)
    lowered(lambda w, i: (F.embedding(i, w, padding_idx=padding_idx) * 2).sum(), emb.weight.detach(), ids, grad=True)


def test_embedding_module_backward(device):
    emb = nn.Embedding(16, 8).to(device)
    ids = repeated(20, 16, device).view(4, 5)
    ref = nn.Embedding(16, 8).to(device)
    ref.load_state_dict(emb.state_dict())
    fresh_compile(lambda i: emb(i).sum())(ids).backward()
    ref(ids).sum().backward()
    torch.testing.assert_close(emb.weight.grad, ref.weight.grad)
    assert not ember.metrics.fallbacks


def test_index_grads(device):
    """Backward of advanced indexing and index_select: index_put / index_add with repeated indices."""
    x = torch.randn(7, 5, device=device)
    lowered(lambda a, p: a[p].sin(), x, repeated(9, 7, device), grad=True)
    lowered(lambda a, p: a.index_select(1, p) * 3, x, repeated(8, 5, device), grad=True)


# --- scatter, scatter_add, scatter_reduce ------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_add_and_grad(device, dim):
    x, src = torch.randn(5, 6, device=device), torch.randn(4, 5, device=device)
    index = torch.randint(0, x.shape[dim], (4, 5), device=device)
    lowered(lambda a, i, s: torch.scatter_add(a.cos(), dim, i, s * 2), x, index, src, grad=True)


def test_gather_backward_is_scatter_add(device):
    x = torch.randn(6, 5, device=device)
    lowered(lambda a, i: torch.gather(a, 0, i).exp(), x, torch.randint(0, 6, (9, 5), device=device), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_src_and_value(device, dtype):
    x = torch.randn(6, 5, device=device).mul(10).to(dtype)
    src = torch.randn(4, 7, device=device).mul(10).to(dtype)
    index = distinct_along(0, (4, 5), 6, device)
    lowered(lambda a, i, s: torch.scatter(a, 0, i, s), x, index, src)
    # one value everywhere: repeats write the same thing, so they are fine here
    lowered(lambda a, i: torch.scatter(a, 1, i, 3), x, torch.randint(0, 5, (6, 3), device=device))


def test_scatter_grad(device):
    x, src = torch.randn(6, 5, device=device), torch.randn(4, 5, device=device)
    lowered(lambda a, i, s: torch.scatter(a, 0, i, s).tanh(), x, distinct_along(0, (4, 5), 6, device), src, grad=True)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_scatter_reduce(device, reduce, include_self):
    x, src = torch.randn(6, 4, device=device), torch.randn(7, 4, device=device)
    index = torch.randint(0, 6, (7, 4), device=device)
    index[:, 0] = 2           # a column with one position hit many times and others not at all
    lowered(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, reduce, include_self=include_self) - 1, x, index, src)


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_integer_mean(device, include_self):
    x, src = torch.randint(-50, 50, (5, 3), device=device), torch.randint(-50, 50, (6, 3), device=device)
    lowered(lambda a, i, s: torch.scatter_reduce(a, 1, i, s, "mean", include_self=include_self),
            x, torch.randint(0, 3, (5, 3), device=device), src[:5])


def test_scatter_reduce_bf16(device):
    x, src = (torch.randn(n, 4, device=device, dtype=torch.bfloat16) for n in (6, 7))
    index = torch.randint(0, 6, (7, 4), device=device)
    lowered(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, "mean"), x, index, src)


def test_scatter_reduce_amax_falls_back(device):
    x, src = torch.randn(6, 4, device=device), torch.randn(7, 4, device=device)
    check(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, "amax"), x, torch.randint(0, 6, (7, 4), device=device), src)
    assert set(ember.metrics.fallbacks) == {"aten.scatter_reduce.two"}


def test_dynamic_shapes(device):
    for n in (5, 9):
        x, src = torch.randn(n, 3, device=device), torch.randn(n + 2, 3, device=device)
        lowered(lambda a, i, s: torch.index_add(a, 0, i, s) * 2, x, repeated(n + 2, n, device), src, dynamic=True)


# --- scheduling and bounds -----------------------------------------------------------------------------------

def test_fill_scatter_and_reader_are_separate_kernels_in_order(device, monkeypatch):
    from ember.schedule import fusion
    runs = []
    real = fusion.Fusion.run

    def run(self):
        groups = real(self)
        runs.append(groups)
        return groups
    monkeypatch.setattr(fusion.Fusion, "run", run)
    lowered(lambda a, p, v: torch.index_put(a.exp(), (p,), v, accumulate=True).sin() + a,
            torch.randn(8, 4, device=device), repeated(8, 8, device), torch.randn(8, 4, device=device))
    groups = runs[-1]
    at = {n.name: k for k, g in enumerate(groups) for n in g.nodes}
    scatters = [n for g in groups for n in g.nodes if isinstance(n.buf, ScatterBuffer)]
    assert len(scatters) == 1
    s = scatters[0]
    target = s.buf.storage_name()
    fill, scatter_group = at[target], groups[at[s.name]]
    readers = [at[n.name] for g in groups for n in g.nodes if target in n.reads and n is not s]
    assert [n.name for n in scatter_group.nodes] == [s.name]
    assert fill < at[s.name] and readers and all(k > at[s.name] for k in readers)


@pytest.mark.skipif(ember.config.cpu_backend != "cpp", reason="the C++ backend checks indirect indices")
def test_out_of_range_index_raises(device):
    if device != "cpu":
        pytest.skip("C++ backend only")
    f = fresh_compile(lambda a, p, v: torch.index_put(a, (p,), v, accumulate=True))
    x, v = torch.randn(4, 2), torch.randn(2, 2)
    torch.testing.assert_close(f(x, torch.tensor([1, 1]), v), torch.index_put(x, (torch.tensor([1, 1]),), v, True))
    with pytest.raises(IndexError, match="out of range"):
        f(x, torch.tensor([1, 4]), v)


# --- scatters written into the input they update ----------------------------------------------------------

class _CachedAttention(nn.Module):
    """A decode step's attention over a static KV cache written in place (`index_copy_`)."""

    def __init__(self, device, heads=2, length=16, dim=8):
        super().__init__()
        self.register_buffer("kc", torch.randn(1, heads, length, dim, device=device))
        self.register_buffer("vc", torch.randn(1, heads, length, dim, device=device))

    def forward(self, q, k, v, pos):
        self.kc.index_copy_(2, pos, k)
        self.vc.index_copy_(2, pos, v)
        return F.scaled_dot_product_attention(q, self.kc, self.vc)


def test_kv_cache_written_in_place(device):
    eager, compiled = _CachedAttention(device), _CachedAttention(device)
    compiled.load_state_dict(eager.state_dict())
    step = fresh_compile(compiled)
    for p in (3, 4, 9):
        q, k, v = (torch.randn(1, 2, 1, 8, device=device) for _ in range(3))
        pos = torch.tensor([p], device=device)
        torch.testing.assert_close(step(q, k, v, pos), eager(q, k, v, pos))
        torch.testing.assert_close(compiled.kc, eager.kc)
        torch.testing.assert_close(compiled.vc, eager.vc)
    assert ember.metrics.scatters_in_place == 2


def _read_before_write(c, p, v):
    old = c.sum(0)                      # the input's old value is read: the scatter needs a copy
    c.index_copy_(0, p, v)
    return old + c.sum(0)


def _functional_scatter(c, p, v):
    return c.index_copy(0, p, v) * c     # no write-back, and the old value is read


def _two_writes(c, p, v):
    c.index_copy_(0, p, v)
    c.index_copy_(0, p.flip(0), 2 * v)
    return c.sum(0)


def _scatter_add_in_place(c, p, v):
    c.scatter_add_(0, p[:, None].expand(-1, c.shape[1]), v)
    return c * 2


@pytest.mark.parametrize("fn, in_place", [(_read_before_write, 0), (_functional_scatter, 0), (_two_writes, 0),
                                          (_scatter_add_in_place, 1)])
def test_scatter_into_input_only_when_nothing_else_reads_it(device, fn, in_place):
    c, p, v = torch.randn(9, 4, device=device), torch.randperm(9, device=device)[:5], torch.randn(5, 4, device=device)
    ce, ca = c.clone(), c.clone()
    expected = fn(ce, p, v)
    actual = fresh_compile(fn)(ca, p, v)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(ca, ce)
    assert ember.metrics.scatters_in_place == in_place
