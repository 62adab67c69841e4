"""What the forward of a training graph saves for the backward (graph/passes/partition.py): values the
backward's products read (a norm's output, an MLP's activation) are recomputed from what the backward
saves anyway, weights' autocast copies stay saved unless config.save_weight_casts is off, and every
gradient matches eager's."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.graph.passes import partition as partition_module
from ember.testing import assert_close, fresh_compile


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class SwiGLUBlock(nn.Module):
    """A Llama layer's MLP half: x + down(silu(gate(norm(x))) * up(norm(x)))."""

    def __init__(self, d=64, f=160):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GELUBlock(nn.Module):
    """A GPT-2 layer's MLP half: x + proj(gelu(fc(layer_norm(x))))."""

    def __init__(self, d=64, f=192):
        super().__init__()
        self.norm, self.fc, self.proj = nn.LayerNorm(d), nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.norm(x)), approximate="tanh"))


class ConvBlock(nn.Module):
    """ResNet's conv -> BatchNorm -> ReLU, twice."""

    def __init__(self, c=8):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def _saved(monkeypatch) -> list:
    """The (shape, dtype) of each tensor the forward of each graph compiled from now on saves for its
    backward, appended to the list returned."""
    found = []
    original = partition_module.min_cut_rematerialization_partition

    def recording(joint_gm, joint_inputs, **kwargs):
        fw, bw = original(joint_gm, joint_inputs, **kwargs)
        for n in bw.graph.find_nodes(op="placeholder"):
            val = n.meta.get("val")
            if "tangents" not in n.name and isinstance(val, torch.Tensor):
                found.append((tuple(val.shape), val.dtype))
        return fw, bw
    monkeypatch.setattr(partition_module, "min_cut_rematerialization_partition", recording)
    return found


def _nbytes(saved) -> int:
    return sum(torch.Size(s).numel() * d.itemsize for s, d in saved)


def _train_step(module, x, autocast: bool, **settings):
    """The module's output and its input's and parameters' gradients: eagerly, under ember (with the
    settings) and, as the reference, eagerly in float64 without autocast, from the same weights, input and
    output gradient."""
    results = []
    grad_out = None
    for run in ("eager", "ember", "float64"):
        m = copy.deepcopy(module)
        xi = x.detach().clone()
        if run == "float64":
            m, xi = m.double(), xi.double()
        xi.requires_grad_(True)
        fn = fresh_compile(m) if run == "ember" else m
        with ember.config.patch(**settings), \
                torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast and run != "float64"):
            out = fn(xi)
        if grad_out is None:
            grad_out = torch.randn_like(out)
        out.backward(grad_out.to(out.dtype))
        results.append((out, [xi.grad] + [p.grad for p in m.parameters()]))
    return results


def _assert_as_accurate_as_eager(results):
    """Under autocast: ember's output and each gradient are at most about as far from the float64
    reference as eager's (relative norm of the difference), as half-precision results are compared
    (a weight gradient sums bf16-rounded products over the tokens; two correct kernels round differently)."""
    (e_out, e_grads), (a_out, a_grads), (r_out, r_grads) = results
    # Triton's interpreter truncates fp32 -> bf16 casts where torch and GPUs round to nearest: 3-4x the error
    factor = 4 if e_out.device.type == "cpu" and ember.config.cpu_backend == "triton" else 2

    def err(v, ref):
        return ((v.double() - ref).norm() / ref.norm()).item()
    for i, (a, e, r) in enumerate(zip([a_out] + a_grads, [e_out] + e_grads, [r_out] + r_grads)):
        assert err(a, r) <= factor * err(e, r) + 1e-3, f"value {i}: ember {err(a, r):.3g}, eager {err(e, r):.3g}"


def _block_input(device, d=64):
    return torch.randn(4, 24, d, device=device)


@pytest.mark.parametrize("block", [SwiGLUBlock, GELUBlock])
def test_the_backward_recomputes_what_its_products_read(block, device, monkeypatch):
    """The norm's output and the activation feed the backward's weight-gradient products; recomputing them
    from the saved residual, row statistics and the products' outputs saves one [tokens, f] and one
    [tokens, d] tensor. Off, torch's policy saves them."""
    torch.manual_seed(0)
    module, x = block().to(device), _block_input(device)
    saved = _saved(monkeypatch)
    (e_out, e_grads), (a_out, a_grads), _ = _train_step(module, x, False, recompute_product_operands=True)
    assert_close(a_out, e_out)
    assert_close(a_grads, e_grads, what="grad")
    recomputed, saved[:] = _nbytes(saved), []
    _train_step(module, x, False, recompute_product_operands=False)
    kept = _nbytes(saved)
    tokens, f = 4 * 24, (module.up if block is SwiGLUBlock else module.fc).out_features
    assert kept - recomputed >= tokens * f * 4, (kept, recomputed)


def test_weight_casts_stay_saved_unless_asked(device, monkeypatch):
    """Under autocast each weight's bf16 copy is saved for the backward's products by default; with
    save_weight_casts off the backward casts the fp32 weights again and the forward saves none of them."""
    torch.manual_seed(0)
    module, x = SwiGLUBlock().to(device), _block_input(device)
    weight_shapes = {tuple(p.shape) for n, p in module.named_parameters() if p.dim() == 2}
    saved = _saved(monkeypatch)
    for save_casts in (True, False):
        saved[:] = []
        _assert_as_accurate_as_eager(_train_step(module, x, True, save_weight_casts=save_casts))
        casts = [s for s, d in saved if d == torch.bfloat16 and s in weight_shapes]
        assert len(casts) == (len(weight_shapes) + 1 if save_casts else 0), saved   # gate and up share a shape


def test_convolution_blocks_train_as_eager_with_recomputed_activations(device, exact_float32_convolutions):
    torch.manual_seed(0)
    module, x = ConvBlock().to(device), torch.randn(2, 8, 10, 10, device=device)
    (e_out, e_grads), (a_out, a_grads), _ = _train_step(module, x, False)
    assert_close(a_out, e_out)
    assert_close(a_grads, e_grads, what="grad", rtol=1e-3, atol=1e-4)


def test_bf16_autocast_block_matches_eager(device):
    torch.manual_seed(0)
    module, x = SwiGLUBlock().to(device), _block_input(device)
    _assert_as_accurate_as_eager(_train_step(module, x, True))


class Checkpointed(nn.Module):
    """Two blocks, the first under torch.utils.checkpoint: its own recompute tags decide for it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = SwiGLUBlock(), SwiGLUBlock()

    def forward(self, x):
        return self.b(torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=False))


def test_activation_checkpointing_keeps_its_own_policy(device):
    torch.manual_seed(0)
    module, x = Checkpointed().to(device), _block_input(device)
    _assert_as_accurate_as_eager(_train_step(module, x, True))
    (e_out, e_grads), (a_out, a_grads), _ = _train_step(module, x, False)
    assert_close(a_out, e_out)
    assert_close(a_grads, e_grads, what="grad")


@pytest.mark.parametrize("width", [64, 33])
@pytest.mark.parametrize("kept", [True, False])
def test_a_checkpointed_dropout_compiles_and_replays_its_mask(device, width, kept):
    """torch.utils.checkpoint over a region with dropout. ember keeps the mask (as bits where it packs:
    32 x 64; 31 x 33 keeps its bool bytes) and recomputes the region's output from it, so the backward replays the region without a
    random op; with packed_dropout_masks off, torch's partitioner replays the draw through
    run_and_save_rng_state / run_with_rng_state (nodes without a fake value; on a GPU
    graphsafe_run_with_rng_state, given generators as graph inputs), which run as ATen calls.
    Either way both graphs compile and the backward's mask is the forward's."""
    torch.manual_seed(0)
    lin = nn.Linear(width, width).to(device)
    fn = fresh_compile(lambda x: torch.utils.checkpoint.checkpoint(
        lambda t: F.dropout(torch.tanh(lin(t)), 0.3, True), x, use_reentrant=False) * 2)
    x = torch.randn(32 if width % 8 == 0 else 31, width, device=device, requires_grad=True)
    saved = []
    with ember.config.patch(packed_dropout_masks=kept), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.numel())) or t, lambda t: t):
        y = fn(x)
    g = torch.randn_like(y)
    y.backward(g)
    dropped = y == 0
    assert 0.1 < dropped.float().mean().item() < 0.5
    xe = x.detach().clone().requires_grad_(True)
    (torch.tanh(lin(xe)) * ~dropped / 0.7 * 2).backward(g)
    assert_close(x.grad, xe.grad, what="grad")
    assert ember.metrics.eager_fallbacks == 0
    # the replay's ops: run_and_save_rng_state / run_with_rng_state; on a GPU graphsafe_run_with_rng_state,
    # handed the generators the call passes
    replayed = sum(n for op, n in ember.metrics.fallbacks.items() if "rng_state" in op)
    if kept:
        assert replayed == 0
        mask = (torch.uint8, x.numel() // 8) if x.numel() % 8 == 0 else (torch.bool, x.numel())
        assert mask in saved
        # of the region's values only its input is kept: the rest is recomputed
        assert sum(1 for d, n in saved if d == x.dtype and n == x.numel()) == 1
    else:
        assert replayed >= 1


def test_a_checkpointed_stochastic_depth_keeps_its_draw(device):
    """Stochastic depth (timm's DropPath: per-sample keep flags from bernoulli) inside
    torch.utils.checkpoint: the flags are saved, not replayed through run_and_save_rng_state, and the
    backward uses the forward's flags."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 64).to(device)

    def region(t):
        keep = t.new_empty(t.shape[0], 1).bernoulli_(0.75)
        return torch.tanh(lin(t)) * keep / 0.75
    fn = fresh_compile(lambda x: torch.utils.checkpoint.checkpoint(region, x, use_reentrant=False) * 2)
    x = torch.randn(64, 64, device=device, requires_grad=True)
    y = fn(x)
    g = torch.randn_like(y)
    y.backward(g)
    rows = (y != 0).any(-1, keepdim=True)
    assert 0.4 < rows.float().mean().item() < 0.95
    xe = x.detach().clone().requires_grad_(True)
    (torch.tanh(lin(xe)) * rows / 0.75 * 2).backward(g)
    assert_close(x.grad, xe.grad, what="grad")
    assert ember.metrics.eager_fallbacks == 0
    assert sum(n for op, n in ember.metrics.fallbacks.items() if "rng_state" in op) == 0


def _joint_graph(module, *inputs):
    """AOTAutograd's joint graph of one training step of `module`, with ember's decompositions."""
    from functorch.compile import aot_module, make_boxed_func
    from torch._functorch.partitioners import default_partition
    from ember.graph.decompose import decomposition_table
    joints = []

    def grab(gm, joint_inputs, **kwargs):
        joints.append(copy.deepcopy(gm))
        return default_partition(gm, joint_inputs, **kwargs)
    compiled = aot_module(module, lambda gm, _: make_boxed_func(gm.forward), partition_fn=grab,
                          decompositions=decomposition_table())
    compiled(*inputs)[0].sum().backward()
    return joints[0]


def _calls(gm) -> list:
    return [(n.target, len(n.users)) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("block", [SwiGLUBlock, GELUBlock, ConvBlock])
def test_the_joint_graph_merges_what_torchs_cse_merges(block):
    """ember merges the joint graph's duplicate nodes itself (graph/passes/cse.py) and turns torch's pass
    off: the graph left is the one torch's `fx_graph_cse` leaves (the same ops, each used as often)."""
    from torch._functorch.compile_utils import fx_graph_cse
    from ember.graph.passes.cse import eliminate_common_subexpressions
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6) if block is ConvBlock else torch.randn(2, 8, 64)
    joint = _joint_graph(block(), x.requires_grad_())
    ours, theirs = copy.deepcopy(joint), copy.deepcopy(joint)
    assert eliminate_common_subexpressions(ours) > 0
    ours.graph.eliminate_dead_code()
    theirs.graph = fx_graph_cse(theirs.graph)
    theirs.graph.eliminate_dead_code()
    assert _calls(ours) == _calls(theirs)


def test_random_values_and_returned_values_are_not_merged(device):
    """Two `rand_like` of one tensor are two draws; two equal values the graph returns are two tensors, as
    in eager; both hold in a training graph, whose gradients match eager's."""
    def f(x):
        return torch.rand_like(x) * x, torch.rand_like(x) * x, x.sin(), x.sin()

    x = torch.randn(64, 32, device=device, requires_grad=True)
    a, b, s, t = torch.compile(f, backend="ember")(x)
    assert not torch.equal(a, b)
    assert s.data_ptr() != t.data_ptr()
    assert_close(s, x.sin())
    (s * 2 + t).sum().backward()
    assert_close(x.grad, 3 * x.detach().cos(), what="grad")


def test_a_training_compile_imports_none_of_inductors_compiler():
    """ember's partition and its AOTAutograd call import neither inductor's pattern matcher (with its
    lowerings) nor its debug module (with its scheduler): seconds of a cold process where torch has no
    bytecode cache."""
    import subprocess
    import sys
    code = ("import sys, torch, ember\n"
            "f = torch.compile(lambda x: (x.sin() * x.cos()).sum(), backend='ember')\n"
            "f(torch.randn(8, 8, requires_grad=True)).backward()\n"
            "print(sorted(m for m in ('torch._inductor.pattern_matcher', 'torch._inductor.lowering',\n"
            "                         'torch._inductor.debug', 'torch._inductor.scheduler') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "EMBER_GRAPH_CACHE": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
