"""ember.compile_graph as a public entry: ATen graphs captured by AOTAutograd (forward and backward of a
transformer block), and graphs that carry no metadata at all."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from functorch.compile import aot_function, aot_module
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.testing import assert_close


class Block(nn.Module):
    """A pre-norm transformer block out of plain ops: matmul attention, softmax, LayerNorm, GELU MLP."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, -1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (c // self.heads) ** 0.5, -1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Compilers:
    """fw/bw compilers for AOTAutograd that hand each ATen graph to ember.compile_graph."""

    def __init__(self):
        self.kinds = []

    def fw(self, gm, example_inputs):
        self.kinds.append("forward")
        return ember.compile_graph(gm, example_inputs)

    def bw(self, gm, example_inputs):
        self.kinds.append("backward")
        return ember.compile_graph(gm, example_inputs, is_backward=True)


def test_compile_graph_returns_a_boxed_callable():
    gm = make_fx(lambda a: (a.exp() + 1,))(torch.randn(3, 4))
    fn = ember.compile_graph(gm, [torch.randn(3, 4)])
    # AOTAutograd calls compilers' results with one list of inputs when this is set
    assert getattr(fn, "_boxed_call", False)
    x = torch.randn(3, 4)
    args = [x]
    out = fn(args)
    assert args == [] and isinstance(out, tuple)
    torch.testing.assert_close(out[0], x.exp() + 1)


@pytest.mark.parametrize("wrapper", ["python", "fx"])
def test_transformer_block_forward_and_backward(wrapper):
    torch.manual_seed(0)
    eager = Block()
    model = Block()
    model.load_state_dict(eager.state_dict())
    compilers = Compilers()
    with ember.config.patch(wrapper=wrapper):
        compiled = aot_module(model, fw_compiler=compilers.fw, bw_compiler=compilers.bw)
        x = torch.randn(2, 8, 32)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_e, out_c = eager(xe), compiled(xc)
        assert_close(out_c, out_e)
        grad = torch.randn_like(out_e)
        out_e.backward(grad)
        out_c.backward(grad)
    assert compilers.kinds == ["forward", "backward"]
    assert_close(xc.grad, xe.grad, what="input grad")
    for (name, pe), pc in zip(eager.named_parameters(), model.parameters()):
        assert_close(pc.grad, pe.grad, what=f"grad of {name}")
    assert ember.metrics.graphs_compiled == 2 and ember.metrics.eager_fallbacks == 0


def test_aot_function_attention():
    def attention(q, k, v):
        s = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)
        return F.layer_norm(s @ v, (v.shape[-1],))

    compilers = Compilers()
    fn = aot_function(attention, fw_compiler=compilers.fw, bw_compiler=compilers.bw)
    args = [torch.randn(2, 6, 16) for _ in range(3)]
    ae = [a.clone().requires_grad_() for a in args]
    ac = [a.clone().requires_grad_() for a in args]
    out_e, out_c = attention(*ae), fn(*ac)
    assert_close(out_c, out_e)
    g = torch.randn_like(out_e)
    out_e.backward(g)
    out_c.backward(g)
    assert compilers.kinds == ["forward", "backward"]
    assert_close([a.grad for a in ac], [a.grad for a in ae], what="grad")


def _strip_metadata(gm):
    for n in gm.graph.nodes:
        n.meta.clear()
    return gm


def test_graph_without_metadata_from_make_fx():
    def fn(x, w):
        h = torch.softmax(x @ w, -1)
        values, indices = torch.sort(h, -1)     # a fallback with two outputs needs its output metadata too
        return values * 2, indices, F.gelu(h).sum(0)

    x, w = torch.randn(5, 8), torch.randn(8, 8)
    gm = _strip_metadata(make_fx(fn)(x, w))
    assert all("val" not in n.meta for n in gm.graph.nodes)
    compiled = ember.compile_graph(gm, [x, w])
    x2, w2 = torch.randn(5, 8), torch.randn(8, 8)
    assert_close(compiled([x2, w2]), fn(x2, w2))
    assert ember.metrics.eager_fallbacks == 0


def test_a_make_fx_graph_reaches_the_passes_with_one_fake_mode():
    """make_fx in real mode fakes each input in a mode of its own; the passes, which run each op they insert on
    its inputs' values, see every value in one mode (else: "Mixing fake modes NYI", as a convolution's bias
    split found on CUDA)."""
    seen = []

    def combine(gm):
        a, b = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        with a.fake_mode:
            seen.append(torch.ops.aten.add.Tensor(a, b).shape)

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    gm = make_fx(lambda x, y: (x * y).relu())(x, y)
    assert len({id(n.meta["val"].fake_mode) for n in gm.graph.nodes if n.op == "placeholder"}) == 2
    with ember.config.patch(post_grad_passes=[combine]):
        compiled = ember.compile_graph(gm, [x, y])
    assert seen == [torch.Size([4, 5])]
    assert_close(tuple(compiled([x, y])), ((x * y).relu(),))


def test_graph_without_metadata_from_symbolic_trace():
    aten = torch.ops.aten

    def fn(x, y):
        return (aten.relu.default(aten.add.Tensor(aten.mul.Tensor(x, y), 1.0)), aten.sum.dim_IntList(x, [1]))

    gm = torch.fx.symbolic_trace(fn)
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    compiled = ember.compile_graph(gm, [x, y])
    assert_close(compiled([x, y]), fn(x, y))
    assert ember.metrics.eager_fallbacks == 0 and ember.metrics.generated_kernel_count >= 1


def test_higher_order_rng_ops_pass_through():
    """run_and_save_rng_state / run_with_rng_state (what rng functionalization leaves in a graph) run as
    extern calls: the replayed random numbers equal the saved ones, so y - z is exactly zero."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        state, y = run_and_save_rng_state(torch.ops.aten.rand.default, [4], device=x.device, dtype=x.dtype,
                                          pin_memory=False)
        z = run_with_rng_state(state, torch.ops.aten.rand.default, [4], device=x.device, dtype=x.dtype,
                               pin_memory=False)
        return (x * 2 + (y - z),)

    gm = make_fx(f)(torch.randn(4))
    fn = ember.compile_graph(gm, [torch.randn(4)])
    x = torch.randn(4)
    (out,) = fn([x.clone()])
    torch.testing.assert_close(out, x * 2)
    assert ember.metrics.eager_fallbacks == 0


def test_an_opaque_graph_input_is_passed_on_as_called():
    """DTensor's traced graphs take opaque objects (traced as FakeScriptObjects) and return some for the
    backward: the wrapper passes on the object it is called with, not the one traced."""
    from torch._library.fake_class_registry import FakeScriptObject
    from torch._subclasses.fake_tensor import FakeTensorMode
    g = torch.fx.Graph()
    x, obj = g.placeholder("x"), g.placeholder("obj")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    g.output((y, obj))
    gm = torch.fx.GraphModule({}, g)
    real, traced = object(), object()
    with FakeTensorMode() as mode:
        x.meta["val"] = mode.from_tensor(torch.randn(4, 8))
        y.meta["val"] = x.meta["val"] * 2.0
    obj.meta["val"] = FakeScriptObject(traced, "Opaque", None)
    compiled = ember.compile_graph(gm, [torch.randn(4, 8), obj.meta["val"]])
    t = torch.randn(4, 8)
    out = compiled([t, real])
    assert_close(out[0], t * 2.0)
    assert out[1] is real


def test_a_generator_graph_input_is_the_one_the_call_passes():
    """AOTAutograd's CUDA-graph-safe replay of a checkpointed random op passes generators as graph inputs
    (graphsafe_run_with_rng_state's rng_state). The compiled graph hands the op the generator it is called
    with, never the one seen while tracing: two calls with generators seeded alike draw alike, and each
    call advances its own generator as eager does."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    g = torch.fx.Graph()
    x, gen = g.placeholder("x"), g.placeholder("rng_state")
    noise = g.call_function(torch.ops.aten.normal_functional.default, (x,), {"generator": gen})
    y = g.call_function(torch.ops.aten.mul.Tensor, (noise, 2.0))
    g.output((y,))
    gm = torch.fx.GraphModule({}, g)
    with FakeTensorMode() as mode:
        x.meta["val"] = mode.from_tensor(torch.randn(4, 8))
        noise.meta["val"] = torch.empty_like(x.meta["val"])
        y.meta["val"] = noise.meta["val"] * 2.0
    traced = torch.Generator().manual_seed(123)
    gen.meta["val"] = traced
    compiled = ember.compile_graph(gm, [torch.randn(4, 8), traced])
    assert ember.metrics.eager_fallbacks == 0
    t = torch.randn(4, 8)
    mine, eager = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(2):                       # the second call draws on from where the first left the generator
        assert_close(compiled([t, mine])[0], torch.empty_like(t).normal_(generator=eager) * 2.0)
    untouched = torch.Generator().manual_seed(123).get_state()
    assert traced.initial_seed() == 123 and torch.equal(traced.get_state(), untouched)


def test_a_compiled_graph_keeps_none_of_the_ir_it_was_built_from():
    """The compiled callable holds its wrapper and kernels, not the fusion groups and loop-level IR they came
    from: those would stay alive (memory, and work for every full pass of Python's collector) as long as the
    compiled model does."""
    import gc
    from ember.ir.deps import MemoryDep
    from ember.ir.nodes import ComputedBuffer

    def ir_objects() -> int:
        gc.collect()
        return sum(isinstance(o, (MemoryDep, ComputedBuffer)) for o in gc.get_objects())

    block = Block()
    x = torch.randn(2, 8, 32, requires_grad=True)
    before = ir_objects()
    compilers = Compilers()
    fn = aot_module(block, fw_compiler=compilers.fw, bw_compiler=compilers.bw)
    out = fn(x)
    out.sum().backward()
    assert compilers.kinds == ["forward", "backward"]
    assert_close(out, block(x))
    assert ir_objects() == before
