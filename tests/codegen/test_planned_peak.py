"""codegen/planned_peak.py: the peak of a wrapper program's memory plan, on hand-written programs (exact
bytes and what is live) and on compiled graphs, against the peak the compiled graph and eager reach when
they run."""
import sys

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.codegen.planned_peak import buffer_bytes, planned_peak, summary
from ember.codegen.wrapper.lines import (Allocate, CallExtern, Free, MultiOutputLine, Name, Return, Reuse, View,
                                         WrapperProgram)
from ember.testing import assert_close, peak_bytes

aten = torch.ops.aten


def _alloc(name):
    return Allocate(name, [1], [1], torch.float32, torch.device("cpu"))


def _plan(lines, sizes):
    return planned_peak(WrapperProgram(["x"], lines + [Return([])], {}), lambda n: sizes.get(n, 0))


def test_reuse_and_in_place_outputs_take_no_new_memory():
    sizes = {"a": 100, "b": 60, "c": 60, "d": 60}
    lines = [_alloc("a"), _alloc("b"), Free(["a"]),
             Reuse("c", "b"),                       # b's memory, b's name dropped
             Reuse("d", "c", release_old=False),    # computed in place: c still bound until its Free
             Free(["c"])]
    peak = _plan(lines, sizes)
    assert (peak.bytes, peak.line, peak.live) == (160, 1, [("a", 100), ("b", 60)])
    # the memory b handed over stays held (by d) to the end
    assert _plan(lines + [_alloc("e")], {**sizes, "e": 100}).bytes == 160


def test_a_view_holds_its_base_until_it_is_freed():
    sizes = {"a": 100, "b": 50}
    held = _plan([_alloc("a"), View("v", "a", [1], [1], 0), Free(["a"]), _alloc("b")], sizes)
    dropped = _plan([_alloc("a"), View("v", "a", [1], [1], 0), Free(["a"]), Free(["v"]), _alloc("b")], sizes)
    assert held.bytes == 150 and sorted(held.live) == [("b", 50), ("v", 100)]
    assert dropped.bytes == 100


def test_extern_results_fresh_or_aliasing_by_schema():
    sizes = {"a": 100, "mm": 40, "sdpa": 0, "out": 30, "lse": 10}
    lines = [_alloc("a"),
             CallExtern("t", aten.t.default, [Name("a")], {}),            # a view: a's memory, nothing new
             CallExtern("mm", aten.mm.default, [Name("t"), Name("a")], {}),
             Free(["a", "t"]),
             CallExtern("sdpa", aten._scaled_dot_product_flash_attention_for_cpu.default, [Name("mm")] * 3, {}),
             MultiOutputLine("out", "sdpa", (0,)), MultiOutputLine("lse", "sdpa", (1,)),
             Free(["out"])]                         # the tuple still holds both results
    peak = _plan(lines, sizes)
    assert peak.bytes == 140 and peak.live == [("a", 100), ("mm", 40)]
    assert _plan(lines + [_alloc("z")], {**sizes, "z": 101}).bytes == 40 + 30 + 10 + 101
    assert _plan(lines + [Free(["sdpa"]), _alloc("z")], {**sizes, "z": 101}).bytes == 40 + 10 + 101


def _planned_programs(monkeypatch):
    """A list that receives (the PlannedPeak, the memory_plan.txt text) of every graph ember compiles."""
    cg = sys.modules["ember.compile_graph"]          # the module: the package's attribute is the function
    seen, generate = [], cg._generate

    def generate_and_plan(*a):
        gm, program, builder = generate(*a)
        seen.append((planned_peak(program, buffer_bytes(builder.g)), summary(program, builder.g)))
        return gm, program, builder
    monkeypatch.setattr(cg, "_generate", generate_and_plan)
    return seen


class Block(torch.nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def test_plan_matches_the_compiled_graph_and_stays_under_eager(device, monkeypatch):
    """An MLP stack's inference graph: the plan's peak is what the compiled graph reaches when it runs (the
    C++ backend's kernels allocate nothing of their own), and no more than eager's."""
    if ember.config.cpu_backend == "triton" and device == "cpu":
        pytest.skip("Triton's interpreter copies every kernel argument, so the measured peak says nothing")
    seen = _planned_programs(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(2)]).to(device).eval()
    x = torch.randn(16, 256, 128, device=device)
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        x = torch.randn(16, 256, 128, device=device)
        assert_close(compiled(x), model(x))
        eager_peak = peak_bytes(lambda: model(x))
        ember_peak = peak_bytes(lambda: compiled(x))
    (peak, text), = seen
    assert text.startswith("planned peak: ") and "live there:" in text
    if device == "cpu":
        assert abs(peak.bytes - ember_peak) <= 0.02 * ember_peak, (peak.bytes, ember_peak)
    assert peak.bytes <= eager_peak, (peak.bytes / 2**20, eager_peak / 2**20)


def test_memory_plan_in_the_debug_dump(tmp_path):
    with ember.config.patch(debug=True, debug_dir=str(tmp_path), graph_cache=False):
        x = torch.randn(64, 32)
        compiled = torch.compile(lambda x: (x @ x.t()).softmax(-1), backend="ember")
        assert_close(compiled(x), (x @ x.t()).softmax(-1))
    plans = list(tmp_path.glob("*/memory_plan.txt"))
    assert plans, list(tmp_path.iterdir())
    text = plans[0].read_text()
    # the graph's memory: the 64x64 float32 product (an extern's result), in which softmax is computed in place
    assert text.startswith("planned peak: 16.00 KiB") and text.count("16.00 KiB") == 2 and "FX node mm" in text, \
        text
