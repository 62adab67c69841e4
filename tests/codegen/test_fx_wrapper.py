"""The FX wrapper: every Wrapper IR line renders into the GraphModule, compiled graphs run through it
and match eager, and an out-of-tree backend (docs/fx_backend_example.py) can take the graph over."""
import importlib.util
import operator
import os

import pytest
import sympy
import torch

import ember
from ember.codegen.wrapper import fx
from ember.codegen.wrapper.lines import (LINE_TYPES, Allocate, Assert, CallExtern, CallKernel, DefineKernel, Free,
                                         MultiOutputLine, Name, Return, Reuse, SymbolDef, View, WrapperProgram)
from ember.codegen.wrapper.python import compile_python
from ember.device import backend_for
from ember.ir.symbolic import FloorDiv, ModularIndexing
from ember.testing import check

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_line_type_has_an_fx_rendering():
    missing = [t.__name__ for t in LINE_TYPES if t not in fx.RENDERERS]
    assert not missing, f"Wrapper IR line types with no FX rendering: {missing}"


_SCALE = """
@triton.jit
def scale2(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask)
    tl.store(out_ptr0 + xindex, tmp0 * 2.0, xmask)
"""



# The hand-written programs below run a Triton kernel on CPU tensors, through Triton's interpreter,
# which is on only where there is no GPU (ember turns it on at import there).
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs the Triton interpreter (machines without a GPU)")

def _interpreter_backend():
    with ember.config.patch(cpu_backend="triton"):
        return backend_for("cpu")


def _every_line_program():
    """A hand-written program that uses every line type, symbols from all four sources, and index
    arithmetic of every shape the renderer handles node by node."""
    s0, s1, s2, s3, n, u0 = sympy.symbols("s0 s1 s2 s3 n u0", integer=True, positive=True)
    f32, cpu = torch.float32, torch.device("cpu")
    numel = s0 * s1
    grid = [FloorDiv(numel + 15, sympy.Integer(16))]
    lines = [
        SymbolDef("s0", "x", "size", 0), SymbolDef("s1", "x", "size", 1), SymbolDef("s2", "x", "stride", 0),
        SymbolDef("s3", "x", "offset"), SymbolDef("n", "k", "value"),
        Allocate("buf0", [s0, s1], [s1, 1], f32, cpu),
        DefineKernel("scale2", _SCALE, _interpreter_backend()),
        CallKernel("scale2", [Name("x"), Name("buf0"), numel], grid, {"XBLOCK": 16}),
        CallExtern("buf1", aten.sort.default, [Name("buf0")], {"dim": -1}),
        MultiOutputLine("buf2", "buf1", (0,)), MultiOutputLine("buf3", "buf1", (1,)),
        SymbolDef("u0", "buf3", "size", 1),          # a size known once an op ran (unbacked)
        Assert("buf2", [s0, s1], [s1, 1]),
        Free(["buf0", "buf1"]),
        Allocate("buf4", [s0, s1], [s1, 1], f32, cpu),
        CallKernel("scale2", [Name("buf2"), Name("buf4"), numel], grid, {"XBLOCK": 16}),
        Reuse("buf5", "buf2"),
        CallKernel("scale2", [Name("buf4"), Name("buf5"), numel], grid, {"XBLOCK": 16}),
        View("view1", "buf5", [s1, s0], [1, s1], 0),
        CallExtern("buf6", aten.add.Tensor, [Name("buf4"), n + ModularIndexing(s0, 1, 2) + sympy.Max(s1, 3)], {}),
        CallExtern("buf7", aten.mul.Tensor, [Name("c0"), 3.0], {}),
        Free(["buf4"]),
        Return([Name("view1"), Name("buf3"), Name("buf6"), Name("buf7"),
                s0 ** 2 + n * FloorDiv(s1, sympy.Integer(2)) - s2 + 2 * s3 * s1 - u0, Name("x")]),
    ]
    return WrapperProgram(["x", "k"], lines, {"c0": torch.arange(4.0)})


def _inputs():
    storage = torch.randn(64)
    return [storage[5:5 + 6 * 7].view(6, 7), 4]


@needs_interpreter
def test_every_line_type_matches_the_python_wrapper():
    program = _every_line_program()
    py_fn, _ = compile_python(program)
    fx_fn, code = fx.compile_fx(program)
    args = _inputs()
    expected = py_fn(list(args))
    actual = fx_fn(list(args))
    ember.testing.assert_close(actual, expected)
    x = args[0]
    assert actual[-2] == 36 + 4 * 3 - 7 + 2 * 5 * 7 - 7
    torch.testing.assert_close(actual[0], (torch.sort(x * 2)[0] * 4).t())
    assert "launch_kernel" in code and "torch.as_strided" in code and "torch.empty_strided" in code


def test_the_python_wrapper_allocates_views_and_calls_through_c_entries():
    """Host time: a buffer on the CPU comes from torch's C allocator entry, an ATen call goes to the op's
    C entry (not OpOverload.__call__), a view is a reinterpreted tensor; the values are eager's."""
    from ember.runtime.tensors import fast_empty_strided
    f32, cpu = torch.float32, torch.device("cpu")
    program = WrapperProgram(["x"], [
        Allocate("buf0", [6, 7], [7, 1], f32, cpu),
        CallExtern(None, aten.mul.out, [Name("x"), 2.0], {"out": Name("buf0")}),
        View("view0", "buf0", [7, 6], [1, 7], 0),
        CallExtern("buf1", aten.add.Tensor, [Name("view0"), 1.0], {}),
        Return([Name("buf1"), Name("view0")]),
    ], {})
    fn, source = compile_python(program)
    x = torch.randn(6, 7)
    out, view = fn([x])
    torch.testing.assert_close(out, (x * 2).t() + 1)
    assert view.stride() == (1, 7) and view.data_ptr() != x.data_ptr()
    assert fn.__globals__["aten_add_Tensor"] is aten.add.Tensor._op, source
    if fast_empty_strided("cpu") is not None:
        assert "empty_strided_cpu(" in source, source


@needs_interpreter
def test_kernel_launches_survive_dead_code_elimination():
    program = _every_line_program()
    gm = fx.FxWrapper().render(program)
    launches = [n for n in gm.graph.nodes if n.target is fx.launch_kernel]
    assert len(launches) == 3 and all(not n.users for n in launches)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert [n for n in gm.graph.nodes if n.target is fx.launch_kernel] == launches
    assert any(n.target is fx.check_layout for n in gm.graph.nodes)
    args = _inputs()
    out = gm(*args)
    torch.testing.assert_close(out[0], (torch.sort(args[0] * 2)[0] * 4).t())


@needs_interpreter
def test_symbols_are_computed_in_the_graph():
    gm = fx.FxWrapper().render(_every_line_program())
    methods = {n.target for n in gm.graph.nodes if n.op == "call_method"}
    assert methods == {"size", "stride", "storage_offset"}
    arith = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {operator.add, operator.mul, operator.floordiv, operator.mod} <= arith
    # another input shape reuses the same graph: nothing was baked in
    storage = torch.randn(80)
    x = storage[3:3 + 5 * 9].view(5, 9)
    out = gm(x, 2)
    assert out[-2] == 25 + 2 * 4 - 9 + 2 * 3 * 9 - 9
    torch.testing.assert_close(out[0], (torch.sort(x * 2)[0] * 4).t())


def test_a_bad_layout_fails_the_assert():
    with pytest.raises(AssertionError, match="unexpected layout"):
        fx.check_layout(torch.empty(2, 3), (2, 3), (1, 2), "buf0")


# -- compiled graphs through wrapper="fx" ------------------------------------------------------------

class Recording(fx.FxWrapper):
    graphs: list = []

    def compile_graph(self, gm):
        Recording.graphs.append(gm)
        return gm


@pytest.fixture
def fx_wrapper():
    Recording.graphs = []
    with ember.config.patch(wrapper="fx", fx_wrapper_class=Recording):
        yield Recording.graphs


def _targets(gms):
    return {n.target for gm in gms for n in gm.graph.nodes if n.op == "call_function"}


def test_pointwise(fx_wrapper, device):
    check(lambda a, b: (a * b + 1).sin().relu(), torch.randn(33, 17, device=device), torch.randn(33, 17, device=device))
    assert len(fx_wrapper) == 1 and fx.launch_kernel in _targets(fx_wrapper)


def test_reduction(fx_wrapper, device):
    check(lambda a: (torch.softmax(a, -1), a.sum(0)), torch.randn(6, 300, device=device))
    assert fx_wrapper and fx.launch_kernel in _targets(fx_wrapper)


def test_fallback_with_multiple_outputs(fx_wrapper, device):
    def fn(a):
        v, i = torch.sort(a, -1)
        return v * 2, i
    check(fn, torch.randn(5, 8, device=device))
    assert {aten.sort.default, operator.getitem} <= _targets(fx_wrapper)


def test_views_are_returned(fx_wrapper, device):
    def fn(a):
        s = torch.sort(a)[0]          # an extern's output: views of it are as_strided in the wrapper
        return s.t(), s[1:, ::2], (a + 1).t()
    check(fn, torch.randn(7, 10, device=device))
    assert torch.as_strided in _targets(fx_wrapper)


def _check_mutation(fn, device):
    x, y = torch.randn(4, 9, device=device), torch.randn(4, 9, device=device)
    xe = x.clone()
    out = torch.compile(fn, backend="ember")(x, y)
    expected = fn(xe, y)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, xe)


def test_input_mutation(fx_wrapper, device):
    def fn(a, b):
        a.add_(b)
        return b.sin(), a.sum(-1)
    _check_mutation(fn, device)
    assert fx_wrapper


def test_input_mutation_read_back_in_the_same_kernel(fx_wrapper, device):
    def fn(a, b):
        a.add_(b)
        return a * 2
    _check_mutation(fn, device)


def test_training_step_forward_and_backward(fx_wrapper, device):
    lin = torch.nn.Linear(8, 16).to(device)
    check(lambda x: torch.nn.functional.gelu(lin(x)).sum(-1), torch.randn(4, 8, device=device), grad=True)
    assert len(fx_wrapper) == 2


def test_dynamic_shapes(fx_wrapper, device):
    def fn(x, y):
        return (x * 2).sum(-1), torch.sort(y)[0].t(), x[:, 1:].exp(), x[1:, ::2] * 3

    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for rows, cols in [(4, 5), (7, 9)]:
        x, y = torch.randn(rows, cols, device=device), torch.randn(3, cols, device=device)
        ember.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(fx_wrapper) == 1       # one graph served both shapes: sizes are computed in it
    assert {operator.floordiv, operator.mul} <= _targets(fx_wrapper)     # grids from the size inputs


def test_wrapper_source_is_the_graph_code(device):
    with ember.config.patch(wrapper="fx"):
        from torch.fx.experimental.proxy_tensor import make_fx
        gm = make_fx(lambda a: (a.cos() * 3,))(torch.randn(4, 4, device=device))
        compiled = ember.compile_graph(gm, [torch.randn(4, 4, device=device)])
        assert "def forward" in compiled.source and "launch_kernel" in compiled.source
        x = torch.randn(4, 4, device=device)
        torch.testing.assert_close(compiled([x])[0], x.cos() * 3)


# -- an out-of-tree backend ----------------------------------------------------------------------------

def _load_example():
    path = os.path.join(ROOT, "docs", "fx_backend_example.py")
    spec = importlib.util.spec_from_file_location("fx_backend_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_backend_runs(device):
    example = _load_example()
    stats = example.run_example(device)
    assert stats["launches"] >= 1 and stats["timed_launches"] == stats["launches"]
    assert stats["max_abs_error"] < 1e-4
