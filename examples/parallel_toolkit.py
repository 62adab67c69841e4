"""The compiler-toolkit flow with ember: a Llama-style model under 2-D parallelism (tensor parallel x data
parallel on a (dp, tp) device mesh), its joint forward + backward graph captured with torch's joint-export
API, a user pass run on it, and the forward and backward graphs compiled with `ember.compile_graph`
(decompositions inside ember), trained for a few steps against eager's losses and parameters.

    torchrun --nproc-per-node 2 examples/parallel_toolkit.py --device cpu     # gloo, mesh 1 x 2
    torchrun --nproc-per-node 2 examples/parallel_toolkit.py --device cuda    # NCCL, one GPU per rank
    torchrun --nproc-per-node 4 examples/parallel_toolkit.py --mesh 2,2       # 2 dp groups of 2 tp ranks

Tensor parallelism: `parallelize_module` on the tp dimension (attention and MLP colwise / rowwise). Data
parallelism: every parameter is stored as a DTensor on the whole mesh, replicated over dp, and computed with
through a parametrization that hands the tensor-parallel layers their tp share, with a gradient that is partial
over dp (each dp rank trains on its own batch): the export traces the averaging all-reduce of every gradient
into the backward graph, so both dimensions' collectives run inside ember's graphs.

Every rank prints PASS when its losses and parameters match eager's (and the collectives ran inside ember's
graphs). On 2 ranks `--mesh 2,1` puts the traffic on the dp dimension instead.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from torch.distributed.tensor import DTensor, Partial, Replicate


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.head_dim = d // heads
        self.wq, self.wk, self.wv = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its share of the heads
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(d), Attention(d, heads)
        self.ffn_norm, self.feed_forward = RMSNorm(d), FeedForward(d, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, hidden=64, layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.norm, self.output = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, targets):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tensor_parallel(model: Llama, mesh) -> Llama:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel()}
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)
    return model


class ReplicatedOverDataParallel(nn.Module):
    """Parametrization of a parameter stored on the (dp, tp) mesh, replicated over dp: the tensor a layer
    computes with is its tp share (a DTensor on the tp mesh when tensor parallelism shards it, else a plain
    tensor), and its gradient, partial over dp, is averaged over dp by the redistribution's backward."""

    def __init__(self, tp_mesh, tp_placements, as_dtensor: bool):
        super().__init__()
        self.tp_mesh, self.tp_placements, self.as_dtensor = tp_mesh, tuple(tp_placements), as_dtensor

    def forward(self, stored):
        local = stored.redistribute(placements=stored.placements).to_local(
            grad_placements=(Partial("avg"),) + self.tp_placements)
        if not self.as_dtensor:
            return local
        return DTensor.from_local(local, self.tp_mesh, self.tp_placements, run_check=False)


def data_parallel(model: nn.Module, mesh) -> nn.Module:
    """Every parameter of the tensor-parallel `model` stored on the 2-D `mesh`, replicated over "dp"."""
    for module in list(model.modules()):
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = isinstance(param, DTensor)
            local, tp_placements = (param.to_local(), param.placements) if sharded else (param.detach(), (Replicate(),))
            stored = DTensor.from_local(local, mesh, (Replicate(),) + tuple(tp_placements), run_check=False)
            delattr(module, name)
            module.register_parameter(name, nn.Parameter(stored))
            parametrize.register_parametrization(
                module, name, ReplicatedOverDataParallel(mesh["tp"], tp_placements, sharded), unsafe=True)
    return model


def decompose_silu(gm: torch.fx.GraphModule) -> int:
    """The user pass: silu(x) -> x * sigmoid(x) in the joint graph. Returns how many it rewrote."""
    aten, count = torch.ops.aten, 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target == aten.silu.default:
            with gm.graph.inserting_before(node):
                sig = gm.graph.call_function(aten.sigmoid.default, (node.args[0],))
                new = gm.graph.call_function(aten.mul.Tensor, (node.args[0], sig))
            new.meta, sig.meta = dict(node.meta), dict(node.meta)
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            count += 1
    gm.graph.lint()
    gm.recompile()
    return count


def collectives_in(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and
               getattr(n.target, "namespace", None) == "_c10d_functional" and "wait" not in str(n.target))


def compile_joint(model, example_args, stack):
    """The model's joint graph, the user pass, and ember's forward and backward compiles -> a callable
    taking the inputs (parameters are passed in the order the export fixed)."""
    import ember
    from torch._functorch.aot_autograd import aot_compile_joint_with_descriptors, aot_export_joint_with_descriptors
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    joint = aot_export_joint_with_descriptors(stack, model, example_args)
    rewritten = decompose_silu(joint.graph_module)
    compiled = aot_compile_joint_with_descriptors(
        joint, partition_fn=min_cut_rematerialization_partition,
        fw_compiler=functools.partial(ember.compile_graph, is_backward=False),
        bw_compiler=functools.partial(ember.compile_graph, is_backward=True))
    named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    params = [named[name] for name in joint.params_spec + joint.buffers_spec]
    return (lambda *args: compiled(*params, *args)), rewritten, collectives_in(joint.graph_module)


def train(loss_fn, params, batches, lr=0.1) -> list:
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for tokens, targets in batches:
        loss = loss_fn(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().item())
    return losses


def main(argv=None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mesh", default=None, help="DP,TP (default: 1,world; DP x TP must be the world size)")
    args = parser.parse_args(argv)
    import ember
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    dp, tp = (int(n) for n in args.mesh.split(",")) if args.mesh else (1, world)
    if dp * tp != world:
        parser.error(f"--mesh {dp},{tp}: DP x TP must be the world size, {world}")
    mesh = init_device_mesh(args.device, (dp, tp), mesh_dim_names=("dp", "tp"))
    ember.config.fallback_on_error = False

    torch.manual_seed(0)
    base = Llama().to(device)
    eager = data_parallel(tensor_parallel(copy.deepcopy(base), mesh["tp"]), mesh)
    model = data_parallel(tensor_parallel(copy.deepcopy(base), mesh["tp"]), mesh)
    # each dp rank its own batches; the tp ranks of a dp rank the same
    g = torch.Generator().manual_seed(1 + mesh.get_local_rank("dp"))
    batches = [tuple(torch.randint(0, 64, (2, 16), generator=g).to(device) for _ in range(2))
               for _ in range(args.steps)]

    eager_losses = train(eager, eager.parameters(), batches)
    with contextlib.ExitStack() as stack:      # the export's tracing contexts, open while it compiles
        step, rewritten, collectives = compile_joint(model, batches[0], stack)
    losses = train(step, model.parameters(), batches)
    close = all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(losses, eager_losses))
    param_diff = max((a.to_local() - b.to_local()).abs().max().item()
                     for a, b in zip(eager.parameters(), model.parameters()))
    # the dp ranks trained on different batches: their replicas agree only if the gradients were averaged
    flat = torch.cat([p.detach().to_local().flatten() for p in model.parameters()])
    replicas = torch.empty(dp * flat.numel(), dtype=flat.dtype, device=device)
    dist.all_gather_into_tensor(replicas, flat, group=mesh.get_group("dp"))
    replica_diff = (replicas.view(dp, -1) - flat).abs().max().item()
    # bucketing merges several collectives of the joint graph into one call
    compiled_collectives = sum(v for k, v in ember.metrics.collectives.items() if "wait" not in k) \
        + ember.metrics.collectives_bucketed - ember.metrics.collective_buckets
    ok = close and param_diff <= 1e-5 and replica_diff <= 1e-6 and rewritten > 0 and collectives > 0 \
        and compiled_collectives == collectives and ember.metrics.eager_fallbacks == 0 \
        and ember.metrics.graphs_compiled == 2
    print(f"rank {rank}: ember {['%.5f' % l for l in losses]} eager {['%.5f' % l for l in eager_losses]} "
          f"max parameter difference {param_diff:.1e} (dp replicas {replica_diff:.1e}), silu rewritten {rewritten}, "
          f"collectives {compiled_collectives}/{collectives} in ember's graphs (mesh {dp} x {tp}): "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    # every rank's collectives done before any rank tears its group down: a rank whose gloo work is still in
    # flight when the other exits can abort at exit
    dist.barrier()
    dist.destroy_process_group()
    return ok


if __name__ == "__main__":
    ok = main()
    # Every rank has checked its results. torch keeps a process group that functional collectives ran on alive
    # past destroy_process_group (its gloo threads keep running), and a gloo worker that releases a finished
    # collective's tensors while the interpreter tears down aborts the process ("terminate called without an
    # active exception"): end without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)
