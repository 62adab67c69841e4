"""Distributed training of a Llama-style model: eager vs inductor vs ember under FSDP2 and FSDP2 x tensor
parallel, one rank per GPU (NCCL) or per process (gloo, CPU).

    torchrun --nproc-per-node 2 benchmarks/distributed_train.py --device cuda --parallel fsdp,fsdp_tp \\
        --backends eager,inductor,ember --steps 20 --out DIR [--profile]
    torchrun --nproc-per-node 2 benchmarks/distributed_train.py --device cpu --layers 2 --dim 64 --seq 32 \\
        --backends eager,inductor,ember --steps 5 --out DIR            # smoke test (gloo, fp32)

The model: token embedding, `--layers` pre-norm blocks (RMSNorm, rotary embeddings, causal SDPA attention,
SwiGLU MLP), a final RMSNorm, an LM head (untied unless `--tie`) and the cross-entropy loss, all inside
`forward(tokens, targets)`. bf16 autocast on CUDA (fp32 weights and AdamW states), fp32 on the CPU.

Parallelism (`--parallel`, comma-separated, each run for every backend):
- fsdp: `fully_shard` on each block and on the root over all ranks.
- fsdp_tp: a 2-D mesh (dp, tp) (`--mesh DP,TP`; default TP = 2, DP = world / 2: on 2 GPUs, 1 x 2).
  Tensor parallelism with `parallelize_module`: q/k/v/gate/up colwise, o/down rowwise, the embedding
  rowwise and the LM head colwise (logits gathered, replicated); `--sp` adds SequenceParallel on the norms
  (the residual stream sharded along the sequence). Then `fully_shard` over the dp dimension (also when dp
  is 1: the plan is the same on any number of GPUs).
Compilation (`--compile`): `blocks` compiles each block in place (`block.compile(backend=...)`, the
module form of torch.compile; FSDP2's hooks run eagerly around it), `blocks+head` also compiles the final
norm, the LM head and the cross-entropy as one function (as torchtitan compiles its loss), `whole` compiles
the whole model. `--compile-optimizer` compiles the AdamW step too.

Runs: every (parallel, backend) pair in turn, in this one process group (no subprocesses). Each run
rebuilds the model from the same seed, resets Dynamo (`torch._dynamo.reset()`) and ember's metrics, and
trains `--steps` AdamW steps on the same deterministic random batches (each dp rank its own, the tp ranks of
a dp rank the same; `--distinct-batches` batches cycled so the loss falls). eager runs first so that the
compiled backends' losses can be compared with it. The loss reported per step is the mean over ranks.
`--interleave` builds every backend's model at once instead and trains them step by step in turn, each
step starting with the next backend: one process's drift (the host's speed varies by up to 1.4x from one
process to the next on one host) then falls on every backend alike.

Table columns: tokens/s = global tokens per step (batch x seq x dp) / the median step time after `--warmup`
steps (each step ends with a device sync; the slowest rank's time per step); first call s = step 0
(Dynamo + the backend's compiles + the step); peak GiB = torch.cuda.max_memory_allocated() over the run
(largest rank); max |dloss| = the largest |loss - eager's loss| over the steps. The ember row also shows its
graphs and eager fallbacks (`ember.metrics`): "no fallback" means every graph ember was given compiled.
On-disk caches (ember's graph cache, inductor's FX graph cache) shorten first calls after the first run:
EMBER_GRAPH_CACHE=0 and TORCHINDUCTOR_FX_GRAPH_CACHE=0 measure cold compiles.

`--profile`: after the timed steps, `--profile-steps` more steps of each backend in `--profile-backends`
run under torch.profiler; the trace goes to DIR/trace_<backend>_<parallel>.json (rank 0;
..._rank<R>.json for the others), and the fraction of NCCL kernel time that overlaps compute kernels
running on other streams is printed and written to the results. `--sample-host`: the timed steps after the
warm-up ones run under benchmarks/host_sampler.py, and each rank's shares of samples per layer (Dynamo,
AOTAutograd, FSDP, ember...) and per function go to the results as `host_samples`. DIR/results.json (rank 0) holds the
configuration and every run's numbers, losses and metrics; it is rewritten after each run.

A run that raises (a compile error is raised alike on every rank) is reported as FAILED, with its error in
results.json, and the next run starts; a rank left waiting in a collective by another rank's failure waits
for the process group's timeout (`--timeout-s`) and fails too.

Known limit of torch's tracing (aot_eager fails alike, torch 2.13): `--compile whole` with fsdp_tp fails in
AOTAutograd (mixed fake modes at the tensor-parallel embedding; with the embedding replicated, an invalid
tangent). torchtitan's flow, per-block compilation, is the default.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._functional_collectives import AsyncCollectiveTensor

import ember  # registers the backend; imported before triton

try:
    from benchmarks.host_sampler import HostSampler
except ImportError:         # run as a script from benchmarks/
    from host_sampler import HostSampler

# -- the model -------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(seq: int, head_dim: int, theta: float = 10000.0):
    """cos and sin of the rotary angles, (seq, head_dim): position p, pair i rotates by p / theta^(2i/head_dim)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """x (batch, heads, seq, head_dim) rotated pairwise: the first half of head_dim pairs with the second."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds its share of the heads
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.feed_forward = RMSNorm(dim), FeedForward(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, seq: int, tie: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm, self.output = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        if tie:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, targets):
        h = self.tok_embeddings(tokens)
        if isinstance(h, AsyncCollectiveTensor):
            # A tensor-parallel embedding's output is an AsyncCollectiveTensor. Given to a compiled block as
            # it is, newer torch drops its requires_grad (the embedding gets no gradient) and older torch
            # may expect it as a tangent type; a copy is a plain tensor
            # (experiments/tp_act_input_grad_repro.py).
            h = h.clone()
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.head_loss(h, targets)

    def head_loss(self, h, targets):
        """The final norm, the LM head and the loss (`--compile blocks+head` compiles this as one function)."""
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def swiglu_hidden(dim: int, multiple: int = 256) -> int:
    """Llama's MLP width: 2/3 of 4 * dim, rounded up to a multiple of `multiple`."""
    return multiple * math.ceil(int(8 * dim / 3) / multiple)


# -- parallelism -----------------------------------------------------------------------------------------

def tensor_parallel_plans(sp: bool):
    """(plan of each block, plan of the root's own modules) for parallelize_module."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    residual = Shard(1) if sp else Replicate()      # the layout of the stream between the blocks
    block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
             "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=residual),
             "feed_forward.gate": ColwiseParallel(), "feed_forward.up": ColwiseParallel(),
             "feed_forward.down": RowwiseParallel(output_layouts=residual)}
    root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
            "output": ColwiseParallel(input_layouts=residual, output_layouts=Replicate())}
    if sp:
        block.update({
            "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
            # the norms' outputs, sharded along the sequence, gathered before the projections
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
        root["norm"] = SequenceParallel()
    return block, root


def parallelize(model: Llama, parallel: str, mesh, args, backend: str) -> nn.Module:
    """The model sharded (and tensor-parallel) as `parallel` says, compiled with `backend` as --compile says."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    dp_mesh = mesh
    if parallel == "fsdp_tp":
        from torch.distributed.tensor.parallel import parallelize_module
        block_plan, root_plan = tensor_parallel_plans(args.sp)
        tp_mesh = mesh["tp"]        # one object: Dynamo guards on the identity of the mesh a block's hooks hold
        for block in model.layers:
            parallelize_module(block, tp_mesh, block_plan)
        parallelize_module(model, tp_mesh, root_plan)
        dp_mesh = mesh["dp"]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.fsdp_bf16 else MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
        if backend != "eager" and args.compile in ("blocks", "blocks+head"):
            block.compile(backend=backend)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    if backend != "eager" and args.compile == "blocks+head":
        # as torchtitan compiles its loss beside the blocks; the head's parameters are the root's, gathered by
        # the root's hook before its forward
        model.head_loss = torch.compile(model.head_loss, backend=backend)
    if backend != "eager" and args.compile == "whole":
        return torch.compile(model, backend=backend)
    return model


def build_mesh(parallel: str, device: str, world: int, mesh_arg):
    from torch.distributed.device_mesh import init_device_mesh
    if parallel == "fsdp":
        return init_device_mesh(device, (world,))
    dp, tp = mesh_arg or (max(world // 2, 1), min(world, 2))
    if dp * tp != world:
        raise SystemExit(f"--mesh {dp},{tp} does not cover the {world} ranks")
    return init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))


def dp_coordinates(parallel: str, mesh, rank: int, world: int):
    """(this rank's index along the data-parallel dimension, its size)."""
    if parallel == "fsdp":
        return rank, world
    return mesh["dp"].get_local_rank(), mesh["dp"].size()


# -- one run ---------------------------------------------------------------------------------------------

def batches(args, dp_rank: int, count: int, device):
    """`count` (tokens, targets) pairs of this dp rank; batch i is batch i % --distinct-batches."""
    out = []
    for i in range(count):
        g = torch.Generator().manual_seed(args.seed * 1000003 + (i % args.distinct_batches) * 1009 + dp_rank)
        seq = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        out.append((seq[:, :-1].to(device), seq[:, 1:].to(device)))
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_steps(model, opt, data, device, autocast, opt_step=None) -> tuple:
    """Run one AdamW step per batch (`opt_step`: opt.step, or it compiled) -> (losses, detached; each step's
    seconds, device synced; each step's host seconds, until the step's last call returned)."""
    losses, seconds, host_seconds = [], [], []
    for tokens, targets in data:
        start = time.perf_counter()
        with autocast():
            loss = model(tokens, targets)
        loss.backward()
        (opt_step or opt.step)()
        opt.zero_grad(set_to_none=True)
        host_seconds.append(time.perf_counter() - start)
        sync(device)
        seconds.append(time.perf_counter() - start)
        losses.append(loss.detach().float())
    return losses, seconds, host_seconds


def profiled_steps(model, opt, data, device, autocast, path: str, opt_step=None) -> dict:
    """The steps under torch.profiler, the trace written to `path` -> its NCCL overlap summary."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        train_steps(model, opt, data, device, autocast, opt_step)
    prof.export_chrome_trace(path)
    with open(path) as f:
        return nccl_overlap(json.load(f))


def ember_counts() -> dict:
    m = ember.metrics
    return {"graphs_compiled": m.graphs_compiled, "eager_fallbacks": m.eager_fallbacks,
            "generated_kernels": m.generated_kernel_count, "compile_seconds": round(m.compile_seconds, 2),
            "linear_cross_entropy_rewrites": m.linear_cross_entropy_rewrites,
            "collectives": dict(m.collectives),
            "collective_fallbacks": {op: n for op, n in m.fallbacks.items() if "c10d" in op}}


class Trainer:
    """One backend's model, optimizer and batches under one parallel plan, built from the same seed as every
    other backend's."""

    def __init__(self, parallel: str, backend: str, mesh, args, device, rank: int, world: int):
        self.parallel, self.backend, self.args, self.device = parallel, backend, args, device
        self.dp_rank, self.dp_size = dp_coordinates(parallel, mesh, rank, world)
        torch.manual_seed(args.seed)        # the same full weights on every rank and every run
        heads = args.heads or max(4, args.dim // 64)
        base = Llama(args.vocab, args.dim, args.layers, heads, args.hidden or swiglu_hidden(args.dim), args.seq,
                     args.tie)
        self.model = parallelize(base.to(device), parallel, mesh, args, backend)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.1)
        self.opt_step = (torch.compile(self.opt.step, backend=backend)
                         if args.compile_optimizer and backend != "eager" else None)
        self.data = batches(args, self.dp_rank, args.steps + (args.profile_steps if args.profile else 0), device)

    def steps(self, data, autocast) -> tuple:
        return train_steps(self.model, self.opt, data, self.device, autocast, self.opt_step)


def fresh_start(device) -> None:
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    ember.metrics.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def summarize(trainer: Trainer, losses, seconds, host_seconds, world: int) -> dict:
    """The run's numbers (agreed over ranks): the slowest rank per step, the losses averaged over ranks (the
    tp ranks of a dp rank agree), the host's share, the peak, Dynamo's and ember's counts."""
    from torch._dynamo.utils import counters
    args, device = trainer.args, trainer.device
    result = {"backend": trainer.backend, "parallel": trainer.parallel,
              "compile": args.compile if trainer.backend != "eager" else None,
              "compiled_optimizer": trainer.opt_step is not None}
    times = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    mean_losses = torch.stack(losses).double()
    dist.all_reduce(mean_losses)
    timed = times.tolist()[args.warmup:] or times.tolist()[-1:]
    median = statistics.median(timed)
    # the host's share: the slowest rank's median time until a step's last call returned (a step whose
    # host time is near its step time is bound by the host)
    host = torch.tensor(statistics.median(host_seconds[args.warmup:] or host_seconds[-1:]), dtype=torch.float64,
                        device=device)
    dist.all_reduce(host, op=dist.ReduceOp.MAX)
    result.update(losses=(mean_losses / world).tolist(), step_seconds=times.tolist(), median_step_s=median,
                  tokens_per_s=args.batch * args.seq * trainer.dp_size / median, first_call_s=times[0].item(),
                  median_host_s=host.item())
    if device.type == "cuda":
        peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        result["peak_bytes"] = int(peak.item())
    result["graph_breaks"] = sum(counters["graph_break"].values())
    result["dynamo_graphs"] = counters["stats"]["unique_graphs"]
    if trainer.backend == "ember":
        per_rank = [None] * world
        dist.all_gather_object(per_rank, ember_counts())
        result["ember"] = per_rank
        result["ember_no_fallback"] = all(c["eager_fallbacks"] == 0 and c["graphs_compiled"] > 0
                                          and not c["collective_fallbacks"] for c in per_rank)
    return result


def run(parallel: str, backend: str, mesh, args, device, rank: int, world: int, autocast) -> dict:
    fresh_start(device)
    trainer = Trainer(parallel, backend, mesh, args, device, rank, world)
    sync(device)
    dist.barrier()
    if args.sample_host:       # the steps after the warm-up ones sampled (benchmarks/host_sampler.py)
        losses, seconds, host_seconds = trainer.steps(trainer.data[:args.warmup], autocast)
        with HostSampler() as sampler:
            more = trainer.steps(trainer.data[args.warmup:args.steps], autocast)
        losses, seconds, host_seconds = (a + b for a, b in zip((losses, seconds, host_seconds), more))
    else:
        losses, seconds, host_seconds = trainer.steps(trainer.data[:args.steps], autocast)
    result = summarize(trainer, losses, seconds, host_seconds, world)
    if args.sample_host:
        per_rank = [None] * world
        dist.all_gather_object(per_rank, sampler.summary())
        result["host_samples"] = per_rank
    if args.profile and backend in args.profile_backends:
        name = f"trace_{backend}_{parallel}" + (f"_rank{rank}" if rank else "") + ".json"
        overlap = profiled_steps(trainer.model, trainer.opt, trainer.data[args.steps:], device, autocast,
                                 os.path.join(args.out, name), trainer.opt_step)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, overlap)
        result["nccl_overlap"] = per_rank
    del trainer
    return result


def run_interleaved(parallel: str, mesh, args, device, rank: int, world: int, autocast) -> list:
    """Every backend's model at once, trained step by step in turn (step i starts with backend i mod n), so
    that what drifts during a process (the host's speed, the allocator's state) falls on every backend alike.
    One Dynamo cache serves all backends (its entries are per backend); ember's counts and the peak are the
    process's, not one backend's."""
    fresh_start(device)
    trainers = [Trainer(parallel, b, mesh, args, device, rank, world) for b in args.backends]
    records = {t.backend: ([], [], []) for t in trainers}
    sync(device)
    dist.barrier()
    for i in range(args.steps):
        for k in range(len(trainers)):
            t = trainers[(i + k) % len(trainers)]
            for acc, new in zip(records[t.backend], t.steps(t.data[i:i + 1], autocast)):
                acc.extend(new)
    return [dict(summarize(t, *records[t.backend], world), interleaved=True) for t in trainers]


# -- trace analysis --------------------------------------------------------------------------------------

def _union(intervals: list) -> list:
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _covered(start: float, end: float, merged: list) -> float:
    """How much of [start, end] the sorted disjoint intervals `merged` cover."""
    total = 0.0
    for a, b in merged:
        if a >= end:
            break
        total += max(0.0, min(b, end) - max(a, start))
    return total


def nccl_overlap(trace: dict) -> dict:
    """From a Chrome trace of torch.profiler: the NCCL kernels' total time (us) and the fraction of it
    during which a compute (non-NCCL) kernel ran on another stream of the same device."""
    kernels = [e for e in trace.get("traceEvents", [])
               if e.get("ph") == "X" and e.get("cat") == "kernel" and "dur" in e]

    def stream(e):
        return (e.get("pid"), e.get("args", {}).get("stream", e.get("tid")))

    nccl = [e for e in kernels if "nccl" in e.get("name", "").lower()]
    compute = [e for e in kernels if "nccl" not in e.get("name", "").lower()]
    nccl_us = sum(float(e["dur"]) for e in nccl)
    overlap_us = 0.0
    by_stream: dict = {}
    for e in compute:
        by_stream.setdefault(stream(e), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    merged_without: dict = {}       # (device, stream) -> compute intervals on the device's other streams
    for e in nccl:
        key = stream(e)
        if key not in merged_without:
            merged_without[key] = _union([iv for s, ivs in by_stream.items() if s[0] == key[0] and s != key
                                          for iv in ivs])
        start = float(e["ts"])
        overlap_us += _covered(start, start + float(e["dur"]), merged_without[key])
    return {"nccl_kernels": len(nccl), "nccl_us": round(nccl_us, 1),
            "compute_us": round(sum(float(e["dur"]) for e in compute), 1),
            "overlap_fraction": overlap_us / nccl_us if nccl_us else None,
            "exposed_nccl_us": round(nccl_us - overlap_us, 1),
            "gpu_busy_us": round(sum(b - a for a, b in _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                                                                for e in kernels])), 1),
            "span_us": round(max((float(e["ts"]) + float(e["dur"]) for e in kernels), default=0.0)
                             - min((float(e["ts"]) for e in kernels), default=0.0), 1),
            "compute_by_kind_us": kernel_kinds(compute),
            "top_kernels_us": top_kernels(compute)}


# library kernels by name: cuBLAS/CUTLASS products, fused attention; anything else is a generated kernel
# (Triton) or a small ATen kernel
KERNEL_KINDS = (("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce")),
                ("attention", ("flash", "fmha", "attention", "cudnn")))


def kernel_kinds(kernels: list) -> dict:
    """Total time (us) per kind of kernel (KERNEL_KINDS, else "other")."""
    out: dict = {}
    for e in kernels:
        name = e.get("name", "").lower()
        kind = next((k for k, words in KERNEL_KINDS if any(w in name for w in words)), "other")
        out[kind] = round(out.get(kind, 0.0) + float(e["dur"]), 1)
    return out


def top_kernels(kernels: list, n: int = 12) -> list:
    """The n kernel names with the most total time: [name (60 chars), us, calls]."""
    totals: dict = {}
    for e in kernels:
        t = totals.setdefault(e.get("name", "")[:60], [0.0, 0])
        t[0] += float(e["dur"])
        t[1] += 1
    return [[k, round(v[0], 1), v[1]] for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]]


# -- the table and main ----------------------------------------------------------------------------------

def attach_loss_diffs(results: list) -> None:
    eager = {r["parallel"]: r["losses"] for r in results if r["backend"] == "eager" and "error" not in r}
    for r in results:
        if "error" in r:
            continue
        ref = eager.get(r["parallel"])
        r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], ref)) if ref else None


def table(results: list) -> str:
    rows = [("backend", "parallel", "tokens/s", "x eager", "step ms", "host ms", "peak GiB", "first call s",
             "max |dloss|", "nccl overlap", "ember graphs / fallbacks")]
    eager = {r["parallel"]: r["tokens_per_s"] for r in results if r["backend"] == "eager" and "error" not in r}
    for r in results:
        if "error" in r:
            rows.append((r["backend"], r["parallel"], "FAILED: " + r["error"].strip().splitlines()[-1][:100]))
            continue
        overlap = r.get("nccl_overlap")
        fraction = overlap[0]["overlap_fraction"] if overlap else None
        ember_col = ""
        if r.get("ember"):
            ember_col = (f"{r['ember'][0]['graphs_compiled']} / {sum(c['eager_fallbacks'] for c in r['ember'])}"
                         f" ({'no fallback' if r['ember_no_fallback'] else 'FELL BACK'})")
        rows.append((r["backend"], r["parallel"], f"{r['tokens_per_s']:.0f}",
                     f"{r['tokens_per_s'] / eager[r['parallel']]:.2f}" if r["parallel"] in eager else "-",
                     f"{1e3 * r['median_step_s']:.1f}", f"{1e3 * r['median_host_s']:.1f}",
                     f"{r['peak_bytes'] / 2**30:.2f}" if "peak_bytes" in r else "-", f"{r['first_call_s']:.1f}",
                     "-" if r["max_loss_diff"] is None else f"{r['max_loss_diff']:.2e}",
                     "-" if fraction is None else f"{fraction:.2f}", ember_col))
    # a failed run's row is backend, parallel and its error: the error does not widen a column
    widths = [max(len(row[i]) for row in rows if len(row) == len(rows[0]) or i < 2) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--parallel", default="fsdp,fsdp_tp", help="comma-separated: fsdp, fsdp_tp")
    p.add_argument("--backends", default="eager,inductor,ember", help="comma-separated torch.compile backends")
    p.add_argument("--compile", default="blocks", choices=["blocks", "blocks+head", "whole"])
    p.add_argument("--compile-optimizer", action="store_true",
                   help="also compile the AdamW step (torch.compile(opt.step)) with the same backend")
    p.add_argument("--mesh", default=None, help="DP,TP for fsdp_tp (default: TP=2, DP=world/2)")
    p.add_argument("--sp", action="store_true", help="fsdp_tp: SequenceParallel on the norms")
    p.add_argument("--fsdp-bf16", action="store_true",
                   help="FSDP2 gathers bf16 parameters (MixedPrecisionPolicy); default: fp32 weights, autocast")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median step time")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=None, help="default: max(4, dim / 64)")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default: Llama's 8/3 dim, to 256)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2, help="sequences per dp rank per step")
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding (fsdp only)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distinct-batches", type=int, default=4)
    p.add_argument("--sample-host", action="store_true",
                   help="sample the main thread's stack over the timed steps: where the host time goes, per rank")
    p.add_argument("--interleave", action="store_true",
                   help="build every backend's model at once and train them step by step in turn (one process "
                        "and one Dynamo cache for all; --profile and --sample-host not with it)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-backends", default="inductor,ember")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=300.0, help="the process group's collective timeout")
    p.add_argument("--out", default="distributed_train_out")
    args = p.parse_args(argv)
    args.parallel = args.parallel.split(",")
    args.backends = args.backends.split(",")
    if "eager" in args.backends:        # first: the others' losses are compared with its
        args.backends = ["eager"] + [b for b in args.backends if b != "eager"]
    args.profile_backends = args.profile_backends.split(",")
    args.mesh = tuple(int(n) for n in args.mesh.split(",")) if args.mesh else None
    unknown = set(args.parallel) - {"fsdp", "fsdp_tp"}
    if unknown:
        p.error(f"--parallel: unknown {sorted(unknown)}")
    if args.interleave and (args.profile or args.sample_host):
        p.error("--interleave: --profile and --sample-host run one backend at a time; leave --interleave out")
    if args.tie and "fsdp_tp" in args.parallel:
        p.error("--tie: the embedding (rowwise) and the LM head (colwise) shard differently under fsdp_tp")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
        autocast = lambda: torch.autocast("cuda", torch.bfloat16)      # noqa: E731
    else:
        device, autocast = torch.device("cpu"), contextlib.nullcontext
    os.makedirs(args.out, exist_ok=True)
    config = {k: v for k, v in vars(args).items()}
    config.update(world=world, torch=torch.__version__, python=platform.python_version(),
                  device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
                  command=" ".join(sys.argv))
    results = []
    for parallel in args.parallel:
        mesh = build_mesh(parallel, args.device, world, args.mesh)
        config.setdefault("meshes", {})[parallel] = list(mesh.shape)
        for name in (["+".join(args.backends)] if args.interleave else args.backends):
            try:
                new = (run_interleaved(parallel, mesh, args, device, rank, world, autocast) if args.interleave
                       else [run(parallel, name, mesh, args, device, rank, world, autocast)])
            except Exception:       # noqa: BLE001  the failure is reported and the next run starts
                new = [{"backend": name, "parallel": parallel, "error": traceback.format_exc()}]
                print(f"rank {rank}: {parallel} {name} failed:\n{new[0]['error']}", file=sys.stderr, flush=True)
                # a failure at compile time is the same on every rank; one that is not leaves a rank waiting
                # in a collective until the timeout, and then that rank fails too
                dist.barrier()
            results.extend(new)
            attach_loss_diffs(results)
            for result in new if rank == 0 else ():
                name = result["backend"]
                if "error" in result:
                    print(f"{parallel} {name}: FAILED ({result['error'].strip().splitlines()[-1]})", flush=True)
                    continue
                print(f"{parallel} {name}: {result['tokens_per_s']:.0f} tokens/s, first call "
                      f"{result['first_call_s']:.1f} s, losses {['%.4f' % l for l in result['losses']]}", flush=True)
                if result.get("ember"):
                    print(f"  ember: {result['ember'][0]}", flush=True)
                if result.get("nccl_overlap"):
                    print(f"  NCCL overlap per rank: {result['nccl_overlap']}", flush=True)
            if rank == 0:
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump({"config": config, "runs": results}, f, indent=1)
    if rank == 0:
        print(table(results), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # the results are written: end without the interpreter's teardown, where a native thread left joinable
    # (gloo's, or collective work's) can abort the process ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
