"""One rank of a multi-process test (tests/distributed/spawn_ranks.py starts one process per rank):
`python ranks.py SCENARIOS RANK WORLD STORE OUT` joins a gloo group through the file store STORE, runs
each of SCENARIOS (comma-separated) with ember and eagerly, and writes what the tests check to OUT (JSON:
scenario -> result). One process runs several scenarios: starting one costs more than most scenarios.

Each scenario returns the largest difference between ember's values and eager's (losses, outputs,
parameters after the steps), and the rank adds ember's metrics."""
from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

import ember

STEPS = 5          # steps compared with eager: a wrong update at one step shows in the next losses


class MLP(nn.Module):
    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Blocks(nn.Module):
    """A few residual MLP blocks and a head: FSDP2 shards each block."""
    def __init__(self, d=16, n=2):
        super().__init__()
        self.blocks = nn.ModuleList(MLP(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


class Wide(nn.Module):
    """Layers of 1 MB: DDP's smallest buckets hold one each."""
    def __init__(self, d=16, width=512):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, width), nn.Linear(width, width), nn.Linear(width, width)])
        self.out = nn.Linear(width, d)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def _diff(a, b) -> float:
    """The largest difference of a from b, relative to b's magnitude where that is above 1."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs() / b.abs().clamp(min=1)).max().item()


def _local(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(model, steps, batch):
    """Losses of `steps` SGD steps of a mean-square loss on per-rank batches."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batch[:steps]:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _batches(rank, d=16, out=16, n=8, same_on_every_rank=False):
    g = torch.Generator().manual_seed(100 if same_on_every_rank else 100 + rank)
    return [(torch.randn(n, d, generator=g), torch.randn(n, out, generator=g)) for _ in range(STEPS)]


def _compare_training(eager_model, ember_model, batches, ember_context=contextlib.nullcontext) -> dict:
    eager_losses = _train(eager_model, STEPS, batches)
    with ember_context():
        ember_losses = _train(ember_model, STEPS, batches)
    pairs = [(_local(p), _local(q)) for p, q in zip(eager_model.parameters(), ember_model.parameters())]
    return {"loss_diff": max(_diff(a, b) for a, b in zip(eager_losses, ember_losses)),
            "param_diff": max(_diff(p, q) for p, q in pairs), "losses": [float(l) for l in ember_losses],
            "params": [q.double().sum().item() for _, q in pairs]}


# -- scenarios ------------------------------------------------------------------------------------------

def funcol(rank, world):
    """Functional collectives called in a compiled function, with pointwise work on their results."""
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD

    def f(x, y):
        a = fc.all_reduce(x * 2, "sum", group)          # its input dies with it: reduced in place
        b = fc.all_gather_tensor(y + 1, 0, group)
        c = fc.reduce_scatter_tensor(x.relu(), "sum", 0, group)
        d = fc.all_to_all_single(y * 3, None, None, group)
        p = x @ y.t()
        e = fc.all_reduce(p, "sum", group)              # p is read again: reduced into a copy
        return a.sin() + 1, b * 2, c - 1, d.exp() + a.sum(), e - p, fc.all_reduce(y, "sum", group) + y

    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    ref = f(x, y)
    y_before = y.clone()
    with ember.config.patch(collective_bucket_bytes=0):     # each all-reduce on its own (bucketed: one cat)
        out = torch.compile(f, backend="ember")(x, y)
    return {"diff": max(_diff(a, b) for a, b in zip(out, ref)), "input_kept": torch.equal(y, y_before)}


def tensor_parallel(rank, world):
    """An MLP with colwise / rowwise plans: DTensor's collectives traced into the compiled graphs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    base = MLP()
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    eager = parallelize_module(copy.deepcopy(base), mesh, plan)
    compiled = torch.compile(parallelize_module(copy.deepcopy(base), mesh, plan), backend="ember")
    return _compare_training(eager, compiled, _batches(rank, same_on_every_rank=True))


class NormMLP(nn.Module):
    """A pre-norm residual MLP, for sequence parallelism: the norm runs on each rank's part of the
    sequence, the MLP gathers the sequence and reduce-scatters its output back."""
    def __init__(self, d=16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def sequence_parallel(rank, world):
    """SequenceParallel on a LayerNorm, then colwise / rowwise: all-gather and reduce-scatter in the graphs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    base = NormMLP()
    plan = {"norm": SequenceParallel(), "mlp.fc1": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))}
    eager = parallelize_module(copy.deepcopy(base), mesh, plan)
    compiled = torch.compile(parallelize_module(copy.deepcopy(base), mesh, plan), backend="ember")
    g = torch.Generator().manual_seed(100 + rank)       # each rank holds its part of the sequence
    batches = [(torch.randn(2, 4, 16, generator=g), torch.randn(2, 4, 16, generator=g)) for _ in range(STEPS)]
    return _compare_training(eager, compiled, batches)


def ddp(rank, world):
    """DistributedDataParallel around an ember-compiled MLP, with buckets small enough that Dynamo splits
    the graph at their boundaries (each bucket's all-reduce starts as its part of the backward ends)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    # two 512 x 512 weights of 1 MB each: with 1 MB buckets (DDP's first bucket holds 1 MB), three buckets
    base = Wide()
    eager = DDP(copy.deepcopy(base), bucket_cap_mb=1)
    compiled = torch.compile(DDP(copy.deepcopy(base), bucket_cap_mb=1), backend="ember")
    return _compare_training(eager, compiled, _batches(rank))


def ddp_compiled_autograd(rank, world):
    """DDP's python reducer under compiled autograd: the gradients' all-reduces inside ember's backward
    graph, overlapped with the rest of the backward."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    base = MLP()
    eager = DDP(copy.deepcopy(base))
    with torch._dynamo.config.patch(optimize_ddp="python_reducer"):     # read as DDP is built and run
        compiled = torch.compile(DDP(copy.deepcopy(base)), backend="ember")

    @contextlib.contextmanager
    def compiled_autograd():
        with torch._dynamo.config.patch(optimize_ddp="python_reducer"), \
                torch._dynamo.compiled_autograd._enable(torch.compile(backend="ember")):
            yield
    return _compare_training(eager, compiled, _batches(rank), compiled_autograd)


def fsdp(rank, world):
    """FSDP2: fully_shard per block and on the root; compiled per block, and as a whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    base = Blocks()
    mesh = init_device_mesh("cpu", (world,))     # FSDP2's default mesh is on the GPU where there is one

    def sharded(compile_blocks):
        m = copy.deepcopy(base)
        for b in m.blocks:
            fully_shard(b, mesh=mesh)
            if compile_blocks:
                b.compile(backend="ember")
        return fully_shard(m, mesh=mesh)

    batches = [(x, y[:, :4]) for x, y in _batches(rank)]
    per_block = _compare_training(sharded(False), sharded(True), batches)
    whole = _compare_training(sharded(False), torch.compile(sharded(False), backend="ember"), batches)
    return {"loss_diff": max(per_block["loss_diff"], whole["loss_diff"]),
            "param_diff": max(per_block["param_diff"], whole["param_diff"]), "losses": whole["losses"],
            "params": per_block["params"] + whole["params"]}


def _bucketable(x, y, z):
    """Collectives ember buckets: three all_reduces (sum; one of a transposed value), two all_gathers, two
    reduce_scatters of different shapes; an all_reduce with another op, and one of a bucketed result."""
    c10d, group = torch.ops._c10d_functional, dist.group.WORLD.group_name
    wait = c10d.wait_tensor
    a = wait(c10d.all_reduce(x * 2, "sum", group))
    b = wait(c10d.all_reduce(y.t() + 1, "sum", group))
    c = wait(c10d.all_reduce(z.sin(), "sum", group))
    m = wait(c10d.all_reduce(x.cos(), "max", group))
    g1 = wait(c10d.all_gather_into_tensor(y * 3, 2, group))
    g2 = wait(c10d.all_gather_into_tensor(z[0] - 1, 2, group))
    r1 = wait(c10d.reduce_scatter_tensor(x.relu(), "sum", 2, group))
    r2 = wait(c10d.reduce_scatter_tensor(z.exp(), "sum", 2, group))
    dependent = wait(c10d.all_reduce(a.sum(0) + b.sum(), "sum", group))
    return a + 1, b, c, m, g1, g2 * 2, r1, r2, dependent


def _bucketable_inputs(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(4, 8, generator=g), torch.randn(3, 5, generator=g), torch.randn(6, 2, 3, generator=g)


def bucketed(rank, world):
    """Independent collectives of one kind merged into one (the all_gather's and reduce_scatter's rank
    layout in particular): eager's values on every rank."""
    args = _bucketable_inputs(rank)
    expected = _bucketable(*args)
    with ember.config.patch(collective_bucket_bytes=1 << 20):
        out = torch.compile(_bucketable, backend="ember")(*args)
    return {"diff": max(_diff(a, b) for a, b in zip(out, expected))}


def rank_agreement(rank, world):
    """Rank 1 cannot compile a graph with collectives (its lowering of sin raises): both ranks run it
    eagerly, each with one warning, and compute eager's values."""
    import warnings
    from ember.lowering import registry
    args = _bucketable_inputs(rank)
    expected = _bucketable(*args)
    lowering = registry.lowerings[torch.ops.aten.sin.default]

    def broken(*args, **kwargs):
        raise RuntimeError("this rank's lowering of sin fails")
    registry.lowerings[torch.ops.aten.sin.default] = broken if rank == 1 else lowering
    try:
        with ember.config.patch(fallback_on_error=True), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.compile(_bucketable, backend="ember")(*args)
    finally:
        registry.lowerings[torch.ops.aten.sin.default] = lowering
    return {"diff": max(_diff(a, b) for a, b in zip(out, expected)),
            "warnings": [str(w.message) for w in caught if "ember" in str(w.message)]}


def mismatched_shapes(rank, world):
    """An all_reduce of 4 elements on rank 0 and 6 on rank 1: torch's error, not a hang."""
    group = dist.group.WORLD.group_name

    def f(x):
        return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x * 2, "sum", group))
    out = torch.compile(f, backend="ember")(torch.randn(4 if rank == 0 else 6))
    return {"diff": float(out.sum())}


SCENARIOS = {f.__name__: f for f in (funcol, tensor_parallel, sequence_parallel, ddp, ddp_compiled_autograd, fsdp,
                                     bucketed, rank_agreement, mismatched_shapes)}


def main(scenarios, rank, world, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    ember.config.fallback_on_error = False
    results = {}
    for name in scenarios.split(","):
        torch._dynamo.reset()
        ember.metrics.reset()
        result = results[name] = {"rank": rank}
        try:
            result.update(SCENARIOS[name](rank, world))
        except Exception:
            result["error"] = traceback.format_exc()
        result.update(eager_fallbacks=ember.metrics.eager_fallbacks, graphs=ember.metrics.graphs_compiled,
                      fallbacks=dict(ember.metrics.fallbacks), collectives=dict(ember.metrics.collectives),
                      collectives_bucketed=ember.metrics.collectives_bucketed)
        if "error" in result:
            break           # the other rank may be waiting in a collective of this scenario: end both
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    # the results are written: end without the interpreter's teardown, where a native thread left joinable
    # (gloo's, or collective work's) can abort the process ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
