"""Channels-last planning of convolutions (graph/passes/conv_layout.py): ResNet and ConvNeXt blocks compiled
with conv_layout="channels_last" against eager, outputs, gradients, BatchNorm running statistics and the
strides the user sees; and that the plan took effect: every convolution reads channels-last operands,
and the only layout conversions read graph inputs."""
from __future__ import annotations

import copy
import sys

import pytest
import torch

import ember
from ember.graph.passes import conv_layout
from ember.ir.nodes import ExternKernel, InputBuffer, ReinterpretView
from ember.testing import assert_close, fresh_compile

aten = torch.ops.aten
CONVS = (aten.convolution.default, aten.convolution_backward.default)


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck: 1x1, 3x3 (strided), 1x1 convolutions with BatchNorm and ReLU, and a strided
    1x1 downsample on the residual path."""

    def __init__(self, cin=16, mid=8, cout=32, stride=2):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(cin, mid, 1, bias=False), torch.nn.BatchNorm2d(mid)
        self.c2, self.b2 = torch.nn.Conv2d(mid, mid, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(mid)
        self.c3, self.b3 = torch.nn.Conv2d(mid, cout, 1, bias=False), torch.nn.BatchNorm2d(cout)
        self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + self.down(x))


class ConvNeXtBlock(torch.nn.Module):
    """ConvNeXt's block: depthwise 7x7 convolution, LayerNorm over channels (channels moved last by a
    permute), pointwise linears with GELU, a layer scale and the residual."""

    def __init__(self, dim=16):
        super().__init__()
        self.dw = torch.nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.gamma = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ResNetStem(torch.nn.Module):
    """A 7x7 stride-2 stem on a 3-channel image, max pooling, a bottleneck, and a head that flattens the
    pooled features (a view of a channels-last value) into a linear classifier."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(16),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        self.block = Bottleneck(16, 8, 32, 1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.block(self.stem(x)), 1), 1))


@pytest.fixture
def lowerings(monkeypatch):
    """The GraphLowering of each graph compiled while the test runs."""
    seen = []
    module = sys.modules["ember.compile_graph"]      # the package exports the function of the same name

    class Recording(module.GraphLowering):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)
    monkeypatch.setattr(module, "GraphLowering", Recording)
    return seen


def _bf16_convolutions() -> bool:
    try:
        torch.nn.functional.conv2d(torch.randn(1, 2, 4, 4, dtype=torch.bfloat16),
                                   torch.randn(2, 2, 3, 3, dtype=torch.bfloat16))
        return True
    except RuntimeError:
        return False


DTYPES = [torch.float32] + ([torch.bfloat16] if _bf16_convolutions() else [])


def _results(model, x, train, compiled):
    """model's output on x (stored, eager or compiled) and, where train, the input's and parameters'
    gradients for a fixed random output gradient, then its buffers (BatchNorm's running statistics)."""
    xx = x.clone().requires_grad_(train)
    with torch.no_grad() if not train else torch.enable_grad():
        out = (fresh_compile(model) if compiled else model)(xx)
    values = {"output": out}
    if train:
        torch.manual_seed(1)
        out.backward(torch.randn_like(out))
        values["input grad"] = xx.grad
        values.update({f"{n}.grad": p.grad for n, p in model.named_parameters()})
    values.update({n: b for n, b in model.named_buffers() if b.is_floating_point()})
    return values


def _run(model, x, dtype, train):
    """model compiled with the channels-last plan against an eager copy on the same input: outputs with
    their strides, and where train, the input's and parameters' gradients and BatchNorm's running stats.
    In bfloat16, eager rounds every op's result and ember's kernels once: the output is compared with
    the float32 eager result of the same (rounded) parameters and input (ember's error at most about
    eager's), and everything with ember's result in the traced layouts (the plan changes layouts only;
    ember's bfloat16 BatchNorm gradients differ from eager's more than the output does in either layout)."""
    model = model.to(dtype).train(train)
    x = x.to(dtype)
    eager = _results(copy.deepcopy(model), x, train, compiled=False)
    with ember.config.patch(conv_layout="as_traced"):
        traced = _results(copy.deepcopy(model), x, train, compiled=True) if dtype != torch.float32 else None
    planned = _results(model, x, train, compiled=True)
    for what, ref in eager.items():
        got = planned[what]
        assert got.stride() == ref.stride() or ref.dim() < 2, f"{what}: strides {got.stride()}, eager's {ref.stride()}"
        if traced is None:
            assert_close(got, ref, rtol=1e-4, atol=1e-4, what=what)
        else:
            assert_close(got, traced[what], what=what)
    if traced is not None:
        exact = _results(copy.deepcopy(model).float(), x.float(), False, compiled=False)["output"]
        err, eager_err = ((v.float() - exact).abs().max().item() for v in (planned["output"], eager["output"]))
        assert err <= 2 * eager_err + 2e-2, f"output: ember's error {err:.3g}, eager's {eager_err:.3g}"


def _assert_planned(lowerings, graphs: int) -> None:
    """Every convolution of the compiled graphs reads channels-last operands, and every copy into
    channels-last reads a graph input (no conversion between an ember kernel and a convolution). The
    planned graphs are the last ones compiled."""
    assert len(lowerings) >= graphs
    lowerings = lowerings[-graphs:]
    convs = 0
    for lowering in lowerings:
        for buf in lowering.buffers:
            if isinstance(buf, ExternKernel) and buf.op in CONVS:
                convs += 1
                for i in conv_layout.CONV_OPERANDS[buf.op]:
                    st = [int(s) for s in buf.args[i].layout.stride]
                    assert st[1] == 1 or buf.args[i].layout.size[1] == 1, f"{buf.op} operand {i}: strides {st}"
        for node in lowering.gm.graph.nodes:
            if node.target is aten.clone.default and node.kwargs.get("memory_format") is torch.channels_last:
                assert node.args[0].op == "placeholder", f"{node.args[0].format_node()} converted to channels-last"
    assert convs > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("model, shape", [(Bottleneck, (2, 16, 10, 10)), (ConvNeXtBlock, (2, 16, 9, 9)),
                                          (ResNetStem, (2, 3, 20, 20))], ids=["bottleneck", "convnext", "stem"])
def test_channels_last_plan_matches_eager(lowerings, model, shape, dtype, train):
    with ember.config.patch(conv_layout="channels_last"):
        _run(model(), torch.randn(shape), dtype, train)
    _assert_planned(lowerings, 2 if train else 1)


def test_pooling_reads_its_input_channels_last(monkeypatch):
    """The stem's BatchNorm and ReLU, stored before the max pooling reads them nine times each, are stored in
    the plan's NHWC layout: a row-major copy would be a transpose between the convolution and the pooling."""
    import ember.lowering.pooling as pooling
    strides = []

    def realize(x, reads):
        out = pooling_realize(x, reads)
        if not isinstance(out.data, pooling.Pointwise):
            strides.append([int(s) for s in out.data.layout.stride])
        return out
    pooling_realize = pooling.realize_if_costly
    monkeypatch.setattr(pooling, "realize_if_costly", realize)
    with ember.config.patch(conv_layout="channels_last", realize_max_ops=8):     # stored, whatever its cost
        _run(ResNetStem(), torch.randn(2, 3, 20, 20), torch.float32, train=False)
    assert strides and all(st[1] == 1 for st in strides), strides


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_channels_last_values_are_written_in_memory_order(lowerings, train):
    """Every 4-D value ember's kernels store channels-last is computed in memory order (a buffer contiguous
    in N, H, W, C, viewed as N, C, H, W): a kernel walking N, C, H, W would write with a stride of C."""
    from ember.ir.nodes import ComputedBuffer
    with ember.config.patch(conv_layout="channels_last"):
        _run(ResNetStem(), torch.randn(2, 3, 20, 20), torch.float32, train=train)
    for lowering in lowerings:
        for buf in lowering.buffers:
            if not isinstance(buf, ComputedBuffer):
                continue
            size, stride = [int(s) for s in buf.layout.size], [int(s) for s in buf.layout.stride]
            if len(size) != 4 or size[1] == 1:
                continue
            if stride != [size[1] * size[2] * size[3], size[2] * size[3], size[3], 1]:
                assert stride[1] != 1, f"{buf.name} {size} stored with strides {stride}"


def test_saved_activations_stay_channels_last(lowerings):
    """The forward returns the activations its backward reads channels-last, and the backward's
    placeholders say so: no copy back to NCHW in between."""
    with ember.config.patch(conv_layout="channels_last"):
        _run(Bottleneck(), torch.randn(2, 16, 10, 10), torch.float32, True)
    forward, backward = lowerings
    saved_cl = [n for n in backward.gm.graph.nodes if n.op == "placeholder" and
                isinstance(n.meta["val"], torch.Tensor) and n.meta["val"].dim() == 4 and
                n.meta["val"].stride()[1] == 1 and n.meta["val"].shape[1] > 1]
    assert saved_cl, "no activation reached the backward channels-last"
    assert conv_layout.ADOPTED_INPUTS in backward.gm.meta


def test_as_traced_keeps_eager_layouts(lowerings):
    with ember.config.patch(conv_layout="as_traced"):
        _run(Bottleneck(), torch.randn(2, 16, 10, 10), torch.float32, True)
    for lowering in lowerings:
        assert not any(n.target is aten.clone.default and n.kwargs.get("memory_format") is torch.channels_last
                       for n in lowering.gm.graph.nodes)
        for buf in lowering.buffers:
            if isinstance(buf, ExternKernel) and buf.op in CONVS:
                a = buf.args[1] if buf.op is aten.convolution_backward.default else buf.args[0]
                assert [int(s) for s in a.layout.stride][-1] == 1


def test_auto_follows_the_backend(lowerings):
    """"auto" plans CPU graphs exactly where the CPU kernel backend says its convolutions prefer it."""
    from ember.device import backend_for
    with ember.config.patch(conv_layout="auto"):
        fresh_compile(Bottleneck(64, 16, 64, 1).eval())(torch.randn(1, 64, 6, 6))
    planned = lowerings[0].gm.meta.get(conv_layout.PLANNED, False)
    assert planned == backend_for(torch.device("cpu")).channels_last_convolutions


def test_convolution_output_returned_and_flattened():
    """A convolution's output returned to the user, and flattened by a view that needs NCHW strides."""
    conv = torch.nn.Conv2d(8, 8, 3, padding=1)

    def fn(x):
        y = torch.relu(conv(x))
        return y, conv(y).view(x.shape[0], -1) * 2

    x = torch.randn(2, 8, 5, 5)
    with ember.config.patch(conv_layout="channels_last"):
        out = fresh_compile(fn)(x)
    ref = fn(x)
    assert_close(out, ref)
    assert [o.stride() for o in out] == [r.stride() for r in ref]


def test_unknown_setting_is_an_error():
    with ember.config.patch(conv_layout="nhwc"), pytest.raises(ValueError, match="conv_layout"):
        conv_layout.decide(torch.fx.symbolic_trace(torch.nn.Identity()))
