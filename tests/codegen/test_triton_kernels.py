"""Properties of generated Triton source that the CPU interpreter cannot catch: it runs a program's threads
one after another, where a GPU runs them at once."""
import re

import torch
import torch.nn.functional as F

import ember
from torch.fx.experimental.proxy_tensor import make_fx
from ember.testing import check


def _unguarded_reloads(source: str) -> list:
    """Loads of a buffer the same kernel stored earlier with no barrier in between (a race on a GPU)."""
    found = []
    for kernel in source.split("@triton.jit")[1:]:
        stored = set()
        for line in kernel.splitlines():
            if "debug_barrier" in line:
                stored.clear()
            m = re.search(r"tl\.store\((\w+) \+ ", line)
            if m:
                stored.add(m.group(1))
            m = re.search(r"tl\.load\((\w+) \+ ", line)
            if m and m.group(1) in stored:
                found.append(line.strip())
    return found


class _Block(torch.nn.Module):
    """A BERT output block under bf16 autocast: dense + residual + layer norm, and the next dense."""

    def __init__(self, d=64):
        super().__init__()
        self.dense, self.ln, self.next = torch.nn.Linear(d, d), torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x, res):
        h = self.ln(self.dense(x) + res)
        return self.next(h), h


def test_values_stored_and_read_back_in_one_kernel_are_forwarded_or_fenced(tmp_path, device):
    """The layer norm's output is stored, and read back by its bf16 cast through a view: that reload
    must print the store's index (then the value is forwarded), or follow a barrier."""
    m = _Block().to(device)
    x, res = torch.randn(2, 32, 64, device=device), torch.randn(2, 32, 64, device=device)

    def f(x, res):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return m(x, res)
    with ember.config.patch(cpu_backend="triton", debug=True, debug_dir=str(tmp_path)):
        check(f, x, res, grad=True, rtol=5e-2, atol=5e-2)
    sources = [p.read_text() for p in tmp_path.rglob("kernels.py")]
    assert sources
    for src in sources:
        assert _unguarded_reloads(src) == []


def _reduce_launch(fn, *args):
    # autotuning off: the wrapper then launches with the heuristic's config written out
    with ember.config.patch(cpu_backend="triton", persistent_reduction_max=64, autotune=False):
        compiled = ember.compile_graph(make_fx(fn)(*args), list(args))
        out = compiled(list(args))
    for o, r in zip(out, fn(*args)):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
    # both wrappers' renderings: "XBLOCK=32, ..." (Python) and "XBLOCK = 32, ..." (FX)
    return re.findall(r"XBLOCK ?= ?(\d+), RBLOCK ?= ?(\d+), num_warps ?= ?(\d+)", compiled.source)


def test_a_strided_reduction_reading_a_transposed_tile_avoids_the_faulting_config(device):
    """A reduction along a strided dim that also reads a tile contiguous along rindex faulted on an H100
    at (XBLOCK 64, RBLOCK 32, 8 warps) (heuristics.FAULTING_COLUMN_CONFIG). Looped strided reductions launch with
    16 columns x 256 rows at 8 warps (heuristics.LOOPED_COLUMN_CONFIGS), and that config is not among the
    candidates the autotuner times for either kind."""
    from ember.codegen.triton import heuristics
    a, b = torch.randn(512, 96, device=device), torch.randn(96, 512, device=device)
    assert _reduce_launch(lambda a, b: ((a * b.t()).sum(0),), a, b) == [("16", "256", "8")]
    assert _reduce_launch(lambda a: (a.sum(0),), a) == [("16", "256", "8")]
    assert (64, 32, 8) not in heuristics.LOOPED_COLUMN_CONFIGS


def _launch_blocks(fn, *args):
    with ember.config.patch(cpu_backend="triton", autotune=False):
        compiled = ember.compile_graph(make_fx(fn)(*args), list(args))
        out = compiled(list(args))
    for o, r in zip(out, fn(*args)):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
    return [(int(x), int(r)) for x, r in re.findall(r"XBLOCK ?= ?(\d+), RBLOCK ?= ?(\d+)", compiled.source)]


def test_a_column_reduction_holds_whole_rows_only_while_its_block_stays_small(device):
    """A reduction along a strided dim takes 32 columns per program (coalesced loads): holding 4096-long
    rows whole would be a 32 x 4096 block, 256 values per thread at 16 warps (spilled registers), so it
    loops over the rows instead; rows of 512 still fit (heuristics.PERSISTENT_COLUMN_BLOCK_MAX)."""
    long_rows = torch.randn(4096, 32, device=device)
    (xb, rb), = _launch_blocks(lambda a: (a.sum(0),), long_rows)
    assert xb * rb <= 16384 and rb < 4096
    short_rows = torch.randn(512, 32, device=device)
    assert _launch_blocks(lambda a: (a.sum(0), a.amax(0)), short_rows) == [(32, 512)]
    rows = torch.randn(32, 4096, device=device)                 # contiguous rows: one whole row per program
    assert _launch_blocks(lambda a: (a.sum(1),), rows) == [(1, 4096)]


def test_a_symbolic_column_row_keeps_one_compile_and_narrows_its_block():
    """A symbolic row stays persistent up to config.persistent_reduction_max (one compile serves every
    length under the guard); at launch a long column row takes fewer columns per program instead."""
    from ember.codegen.triton.heuristics import persistent_config
    for rblock in (512, 4096, 16384):
        cfg = persistent_config(64, rblock, contiguous=False, scan=False)
        assert cfg["XBLOCK"] * cfg["RBLOCK"] <= 16384 and cfg["RBLOCK"] == rblock
    assert persistent_config(64, 256, contiguous=False, scan=False)["XBLOCK"] == 32     # short rows: coalesced


def test_float32_erf_is_accurate_everywhere(device):
    """helpers.erf_f32 (a branchless polynomial) against float64: within 2.5 float32 ulps of 1 over the
    range where erf moves, the sign and size kept near 0, and nan / +-inf as eager gives them."""
    x = torch.cat([torch.linspace(-6, 6, 100_001), torch.randn(10_000) * 1e-3,
                   torch.tensor([0.0, -0.0, 1e-30, -3e-38, float("inf"), float("-inf"), float("nan")])]).to(device)
    with ember.config.patch(cpu_backend="triton"):
        got = torch.compile(torch.erf, backend="ember")(x)
    ref = torch.erf(x.double())
    finite = ref.isfinite()
    assert ((got.double() - ref)[finite].abs() <= 2.5 * 2 ** -24 + 2e-7 * ref[finite].abs()).all()
    small = x.abs() < 0.5
    assert ((got.double() - ref)[small].abs() <= 4e-7 * ref[small].abs()).all()      # relative near 0
    assert got[-1].isnan() and got[-3] == 1 and got[-2] == -1


def test_a_large_math_heavy_16bit_pointwise_kernel_takes_16_elements_per_thread(device):
    """GELU over bf16 launches 4096 elements at 8 warps (heuristics.MATH_HEAVY_MIN_ELEMENTS); the same in
    float32, or a plain add in bf16, keeps 1024 at 4 warps."""
    def blocks(fn, *args):
        with ember.config.patch(cpu_backend="triton", autotune=False):
            compiled = ember.compile_graph(make_fx(fn)(*args), list(args))
            out, = compiled(list(args))
        torch.testing.assert_close(out, fn(*args), rtol=2e-2, atol=2e-2)
        return re.findall(r"XBLOCK ?= ?(\d+), num_warps ?= ?(\d+)", compiled.source)

    x = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
    b = torch.randn(2048, device=device, dtype=torch.bfloat16)
    assert blocks(lambda x, b: F.gelu(x + b), x, b) == [("4096", "8")]
    assert blocks(lambda x, b: F.gelu(x + b), x.float(), b.float()) == [("1024", "4")]
    assert blocks(lambda x, b: x + b, x, b) == [("1024", "4")]


def test_a_pointwise_kernel_over_channels_last_buffers_walks_them_in_tiles(device):
    """ConvNeXt's layer scale and residual: every access is contiguous along channels, which is not the
    last logical dim. A flat index in NCHW order would step 96 elements between neighbouring lanes
    (ConvNeXt inference spent a third of its GPU time there). The kernel walks the output in memory order
    (a buffer contiguous in N, H, W, C, returned as its N, C, H, W view), or in 2-D tiles with channels on
    the x axis."""
    def f(x, g, s):
        return g[:, None, None] * x + s
    for shape in ((4, 96, 14, 14), (3, 17, 5, 33)):
        x, s = (torch.randn(*shape, device=device).to(memory_format=torch.channels_last) for _ in range(2))
        g = torch.randn(shape[1], device=device)
        with ember.config.patch(cpu_backend="triton", autotune=False):
            compiled = ember.compile_graph(make_fx(f)(x, g, s), [x, g, s])
            out, = compiled([x, g, s])
        torch.testing.assert_close(out, f(x, g, s))
        assert out.is_contiguous(memory_format=torch.channels_last)
        n, c, h, w = shape
        tiled = re.findall(r"XBLOCK ?= ?\d+, RBLOCK ?= ?\d+", compiled.source)
        in_memory_order = f"({n}, {h}, {w}, {c}), ({h * w * c}, {w * c}, {c}, 1)" in compiled.source
        assert compiled.kernel_count == 1
        assert len(tiled) == 1 or in_memory_order, compiled.source


def test_a_transposing_copy_through_views_of_views_is_tiled(device):
    """BERT's keys for the attention bmm: [tokens, hidden] viewed as heads, permuted to [batch, heads, dim,
    seq] and flattened to [batch * heads, dim, seq]. The read's index keeps floors and mods of the
    flattened index that the loop ranges reduce to plain variables; simplified, it is contiguous along
    another dim than the write, and the kernel walks 2-D tiles (it was a flat kernel reading with a
    stride of 768: 5.3 us a call on an H200 where inductor's tiled one took 2.5 us)."""
    def f(k):
        return (k.view(2, 64, 4, 32).permute(0, 2, 3, 1).float() * 0.5).reshape(8, 32, 64)
    k = torch.randn(128, 128, device=device).bfloat16()
    with ember.config.patch(cpu_backend="triton", autotune=False):
        compiled = ember.compile_graph(make_fx(f)(k), [k])
        out, = compiled([k])
    torch.testing.assert_close(out, f(k))
    assert len(re.findall(r"XBLOCK ?= ?\d+, RBLOCK ?= ?\d+", compiled.source)) == 1      # one kernel, tiled


def test_reductions_time_a_few_candidates_each_within_the_registers():
    """Each tuned reduction times its heuristic's config and at most three more (each a Triton compile):
    never the faulting strided config, at most 1024 elements a warp (no spilled registers) where 16 warps
    allow it, and at least one element a thread."""
    from ember.codegen.triton import heuristics
    assert len(heuristics.TUNED_COLUMN_CONFIGS) <= 3
    assert heuristics.FAULTING_COLUMN_CONFIG not in heuristics.TUNED_COLUMN_CONFIGS
    for X, R in ((8192, 1024), (8192, 768), (524288, 16), (100000, 128), (64, 4096), (3, 2048), (8192, 8192)):
        rblock = heuristics.next_pow2(R)
        cands = heuristics._persistent_candidates(X, rblock, scan=False)
        assert 1 <= len(cands) <= 3
        for c in cands:
            n = c["XBLOCK"] * c["RBLOCK"]
            assert c["RBLOCK"] == rblock and c["XBLOCK"] <= heuristics.next_pow2(X)
            assert 1 <= c["num_warps"] <= 16 and n // c["num_warps"] <= max(1024, n // 16)
            assert c["num_warps"] * 32 <= max(32, n)


def test_strided_welford_reductions_do_not_time_the_slowest_compiling_config(monkeypatch):
    """A strided var_mean (ViT's LayerNorm over a convolution's channels, BatchNorm statistics) is not tuned
    over heuristics.SLOW_WELFORD_COLUMN_CONFIG, its slowest compile and never its winner; a strided sum
    still is."""
    from ember.codegen.triton import backend, heuristics
    seen = []

    def recorded(kernel, best):
        cands = heuristics.candidate_configs(kernel, best)
        seen.append({(c["XBLOCK"], c["RBLOCK"], c["num_warps"]) for c in cands})
        return [best]            # one candidate: nothing is timed here
    monkeypatch.setattr(backend, "candidate_configs", recorded)
    monkeypatch.setattr(backend.TritonBackend, "tunes", property(lambda self: True))
    monkeypatch.setattr(heuristics, "TUNE_MIN_ELEMENTS", 1)
    x = torch.randn(768, 64)            # rows of 768 along a strided dim: one looped reduction
    for fn, welford in ((lambda a: torch.var_mean(a, 0), True), (lambda a: (a.sum(0),), False)):
        seen.clear()
        with ember.config.patch(cpu_backend="triton"):
            compiled = ember.compile_graph(make_fx(fn)(x), [x])
            out = compiled([x])
        for o, r in zip(out, fn(x)):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
        assert len(seen) == 1 and len(seen[0]) >= 3, seen
        assert (heuristics.SLOW_WELFORD_COLUMN_CONFIG in seen[0]) != welford, seen


def test_the_helpers_follow_the_interpreter_setting_they_are_loaded_under(monkeypatch):
    """Generated kernels call ember's @triton.jit helpers (helpers.max_int pads, clamps): a process that
    loaded them with TRITON_INTERPRET unset (a test standing for a GPU) and later runs kernels in the
    interpreter gets helpers it can call there, not JITFunctions ("Cannot call @triton.jit'd outside of the
    scope of a kernel"), and the other way round."""
    from ember.codegen.triton import backend
    from ember.runtime import loader
    monkeypatch.setattr(loader, "_triton_files", {})        # none loaded yet, as in a new process
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not backend.is_interpreted(backend.triton_helpers().max_int)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.is_interpreted(backend.triton_helpers().max_int)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not backend.is_interpreted(backend.triton_helpers().max_int)
