"""CUDA graphs for compiled graphs: `torch.compile(m, backend="ember", mode="reduce-overhead")`,
`ember.config.cudagraphs = True` or `EMBER_CUDAGRAPHS=1`.

A `CudaGraphRunner` wraps one compiled graph's boxed callable. For each distinct set of sizes (one entry
per value of the graph's integer inputs; a static graph has one) the first call runs the graph as it is:
it compiles and tunes every kernel for those sizes. The second call records the graph into a CUDA graph
and replays it; later calls only replay.

Inputs. Every input is first read where it lies: the recording remembers its address and is recorded
again if the address moves. Most do not move: parameters and buffers (which AOTAutograd lists as static),
what a backward graph saved from its forward, outputs of another recording, and, in a steady loop, most
other tensors too, since the caching allocator hands the same block to the same allocation each step (the
gradient a backward graph receives). An input that moved between the warm-up and the recording, or moves
once later (one that is not static or another recording's output), or a static one that moves three times,
is copied from then on into a buffer the
recording owns before each replay, and copied back afterwards when the graph writes into it (a KV cache
passed as a plain tensor, optimizer state). Reading in place spares a copy and the buffer's memory.

Outputs. A replay writes its outputs into the memory of the previous replay's outputs and returns new
tensors over it. When a replay would overwrite an output the program still holds (the previous token fed
back, a list of losses, logits kept for later), the recording is dropped, the held memory stays with the
program, a new recording is made, and from then on that output is returned as a copy
(`ember.metrics.cudagraph_output_copies`). Outputs that are let go before the next call (activations
consumed by the backward, a loss read once) are never copied.

Memory. The recordings on one device share a memory pool, and they do not own their outputs: memory the
program lets go of (a forward's activations, as its backward consumes them; logits dropped after the loss)
is reused by the next capture, as without CUDA graphs. runtime/cudagraph_memory.py keeps the checks that
make this safe: before a replay, memory that its capture found free or consumed must be so again, and the
outputs of later recordings in the pool must be let go.

What is not recorded. A graph that reads or makes CPU tensors, synchronizes with the host (`.item()`,
`nonzero`), has data-dependent sizes or calls an op tagged `cudagraph_unsafe` is split around those nodes
(runtime/cudagraph_partition.py): the runs of nodes between them are compiled and recorded each by a runner
of its own, and those nodes run eagerly between them (the debug log names why). Settings that read or
synchronize after every call (`config.check_nans`, `config.debug_sync`) keep the whole graph unrecorded
(`capture_blockers`). A capture that fails warns once and the graph runs
without CUDA graphs from then on. Random ops draw their seeds with `aten.randint` inside the graph, which
CUDA graphs advance on every replay, so dropout masks differ per step as without graphs.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import warnings
import weakref
from typing import Callable, Optional

import torch

from .. import config, metrics
from . import cudagraph_memory
from .cudagraph_memory import (Pool, Recording, addresses_unmoved, alias_offset, describe_outputs, input_alias,
                               pool_tensor, settle_watches, view_of, view_spec)
from torch.multiprocessing.reductions import StorageWeakRef

log = logging.getLogger("ember.cudagraphs")
aten = torch.ops.aten

# ops that wait for the device and read a value on the host: a recording would bake in the value
_HOST_SYNC = {aten._local_scalar_dense, aten.item, aten.nonzero, aten.masked_select, aten.equal,
              aten.is_nonzero, aten._unique2, aten.unique_consecutive, aten.unique_dim,
              aten.repeat_interleave.Tensor}


def _packets(ops) -> set:
    out = set()
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            out.update(getattr(op, name) for name in op.overloads())
        else:
            out.add(op)
    return out


_HOST_SYNC_OVERLOADS = _packets(_HOST_SYNC)


def values_of(val) -> list:
    return list(val) if isinstance(val, (tuple, list)) else [val]


def own_blockers(n: torch.fx.Node, device_type: str) -> list[str]:
    """Why node `n` itself (what it computes, and its op) cannot be recorded into a CUDA graph on
    `device_type` (empty: it can)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    why = []
    for v in values_of(n.meta.get("val")):
        if isinstance(v, torch.Tensor) and v.device.type != device_type:
            why.append(f"{n.name} is a {v.device.type} tensor")
        if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(v):
            why.append(f"{n.name} has a data-dependent size")
    if n.op == "call_function":
        if n.target in _HOST_SYNC_OVERLOADS:
            why.append(f"{n.name} ({n.target}) synchronizes with the host")
        unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
        if unsafe is not None and unsafe in getattr(n.target, "tags", ()):
            why.append(f"{n.name} ({n.target}) is tagged cudagraph_unsafe")
    return why


def capture_blockers(gm: torch.fx.GraphModule, device_type: str = "cuda") -> list[str]:
    """Why this graph cannot be recorded into a CUDA graph as a whole (empty: it can)."""
    why = list(dict.fromkeys(w for n in gm.graph.nodes for w in own_blockers(n, device_type)))
    if config.check_nans:
        why.append("config.check_nans reads every output on the host")
    if config.debug_sync:
        why.append("config.debug_sync synchronizes after every call")
    return why


def mutated_inputs(gm: torch.fx.GraphModule) -> frozenset:
    """Indices of the graph's inputs that some op of it writes into."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    out = set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, list(n.args) + [n.kwargs.get(a.name) for a in
                                                                 schema.arguments[len(n.args):]]):
            if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                out.add(placeholders[value])
    return frozenset(out)


class CudaCapture:
    """One CUDA graph, recorded into a pool of its device."""

    def __init__(self, pool: Pool):
        self.graph = torch.cuda.CUDAGraph()
        if pool.handle is None:
            pool.handle = torch.cuda.graph_pool_handle()
        self.pool = pool.handle

    def capture(self, fn: Callable, args: list):
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, pool=self.pool):
            outs = fn(args)
        return outs

    reads_args = False      # a CUDA graph reads its inputs' recorded addresses

    def replay(self, args) -> None:
        self.graph.replay()


class EmulatedCapture:
    """A stand-in for CudaCapture on the CPU (tests): `replay` runs the function again on the call's inputs
    (the ones a CUDA graph would read: in place, or the recording's buffers) and writes its results into the
    recorded outputs' memory, as a CUDA graph's replay does. The capture keeps that memory (the pool's part)
    and returns tensors over it that it does not own, as the pool's memory outlives a CUDA graph's outputs."""

    reads_args = True

    def __init__(self, pool: Pool):
        pass

    def capture(self, fn: Callable, args: list):
        # the capture runs the function, which stands for the capture and the run that follows it (`replay`
        # without inputs); as in a capture, the function gets the only references to the inputs
        self.fn = fn
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        self.outs = fn(args)
        _collect_cycles()
        return [o if not isinstance(o, torch.Tensor) or o.untyped_storage().data_ptr() in inputs else _unowned(o)
                for o in self.outs]

    def replay(self, args: Optional[list]) -> None:
        if args is None:
            return          # the run that follows the capture: the capture's
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for old, new in zip(self.outs, self.fn(args)):
            # an output that is an input's memory is already what the graph returns; the others are written
            # as a CUDA graph writes them, unseen by autograd's version counters (`.data`)
            if isinstance(old, torch.Tensor) and old.untyped_storage().data_ptr() not in inputs:
                old.data.copy_(new)
        _collect_cycles()


def _collect_cycles() -> None:
    """Free what the kernels just run left in reference cycles: Triton's interpreter (the CPU's "triton"
    backend) keeps each launch's arguments in one until the cyclic collector runs, and a storage kept so
    looks held to the runner."""
    if config.cpu_backend == "triton":
        import gc
        gc.collect()


def _copy(t: torch.Tensor) -> torch.Tensor:
    metrics.cudagraph_output_copies += 1
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def copy_all(pairs: list) -> None:
    """dst.copy_(src) for each (dst, src): one multi-tensor kernel per dtype and device where there are
    several. A replay copies its moved inputs in: GPT-2's training step copies 20 zero gradients of 12.6 MB
    (its unused key/value outputs, new tensors each step); one cudaMemcpy each took 61 us on an H100."""
    if len(pairs) == 1:
        pairs[0][0].copy_(pairs[0][1])
        return
    groups: dict = collections.defaultdict(lambda: ([], []))
    for dst, src in pairs:
        dsts, srcs = groups[(dst.dtype, src.dtype, dst.device)]
        dsts.append(dst)
        srcs.append(src)
    for dsts, srcs in groups.values():
        torch._foreach_copy_(dsts, srcs)


def _unowned_storage(ptr: int, device, nbytes: int):
    return torch._C._construct_storage_from_data_pointer(ptr, device, nbytes)


def _unowned(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    return view_of(_unowned_storage(st.data_ptr(), t.device, st.nbytes()), view_spec(t), t.device)


def _without_pool_references(args: list, pool_ptrs: set) -> list:
    """args for running the graph if its capture fails, holding no input that lies in pool memory (a
    capture must be free to reuse what the graph frees): those are kept as (ptr, nbytes, device, view) and
    rebuilt over the same memory, which a failed capture has not written."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in pool_ptrs:
            st = a.untyped_storage()
            out.append(("unowned", st.data_ptr(), st.nbytes(), a.device, view_spec(a)))
        else:
            out.append(a)
    return out


def _rebuild(kind, ptr, nbytes, device, view) -> torch.Tensor:
    return view_of(_unowned_storage(ptr, device, nbytes), view, device)


@dataclasses.dataclass
class _Sizes:
    warmed: bool = False
    warm_addresses: dict = dataclasses.field(default_factory=dict)   # input index -> data_ptr at the warm-up
    recording: Optional[Recording] = None
    deferred: bool = False      # the last call ran uncaptured to let the pool's other recordings be redone


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill a block of memory, each once (some order of its strides is contiguous)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True

# data_ptr of each storage that holds a live recording's output -> how many recordings hold it
_recorded_storages: collections.Counter = collections.Counter()


def _forget_storages(ptrs: list) -> None:
    _recorded_storages.subtract(ptrs)
    for p in ptrs:
        if _recorded_storages[p] <= 0:
            del _recorded_storages[p]


class CudaGraphRunner:
    """A boxed callable (`fn(list_of_inputs) -> outputs`) that records `fn` into CUDA graphs and replays
    them (module docstring)."""

    def __init__(self, fn: Callable, *, static_inputs=(), mutated=frozenset(), int_inputs=(), label="graph",
                 capture_factory: Callable = CudaCapture, device="cpu", settling=()):
        self._boxed_call = True
        self.fn, self.label, self.capture_factory = fn, label, capture_factory
        self.pools = cudagraph_memory.pools[str(device)]
        self.static = frozenset(static_inputs)
        self.mutated = frozenset(mutated)
        self.settling = frozenset(settling)       # inputs not copied for moving once after the warm-up
        self.int_inputs = tuple(int_inputs)       # the inputs that are sizes: one recording per value
        self.copied: set = set()                  # inputs copied into the recording's buffers
        self.moves: collections.Counter = collections.Counter()   # index -> times its address moved
        self.copy_outputs: set = set()            # outputs returned as copies
        self.sizes: collections.OrderedDict = collections.OrderedDict()
        self.disabled: Optional[str] = None
        self.warned_sizes = False

    # -- calling ---------------------------------------------------------------------------------------
    def __call__(self, args: list):
        if self.disabled is not None:
            return self.fn(args)
        if self.capture_factory is EmulatedCapture:
            _collect_cycles()     # what uncaptured runs (a warm-up, eager code between graphs) left in cycles
        key = tuple(args[i] for i in self.int_inputs)
        entry = self.sizes.get(key)
        if entry is None:
            self._add_sizes(key).warm_addresses = {i: a.data_ptr() for i, a in enumerate(args)
                                                   if isinstance(a, torch.Tensor)}
            return self.fn(args)              # warm-up: kernels compile and tune for these sizes
        self.sizes.move_to_end(key)
        rec = entry.recording
        if rec is not None and not self._replayable(rec, args):
            # the new recording comes last in the pool: the ones after the old one are recorded again after
            # it, so that the pool's order stays the order the graphs run in (a forward before its backward)
            for later in rec.pool.later_than(rec):
                _drop_recording(later)
            self._drop(entry)
            rec = None
        if rec is None:
            return self._record(entry, args)
        return self._replay(rec, args)

    def _add_sizes(self, key) -> _Sizes:
        limit = max(1, config.cudagraph_max_sizes)
        while len(self.sizes) >= limit:
            _, old = self.sizes.popitem(last=False)
            self._drop(old)
            if not self.warned_sizes:
                self.warned_sizes = True
                warnings.warn(f"ember: {self.label} has been called with more than {limit} distinct sizes; "
                              f"its CUDA graphs are kept for the {limit} most recently used "
                              f"(ember.config.cudagraph_max_sizes)", RuntimeWarning, stacklevel=4)
        entry = self.sizes[key] = _Sizes(warmed=True)
        return entry

    def _replayable(self, rec: Recording, args: list) -> bool:
        checks = (self._can_replay(rec, args), self._later_outputs_free(rec), rec.memory_as_recorded(args))
        if not all(checks):
            log.debug("ember: %s is recorded again (inputs and own outputs %s, later recordings' outputs %s, "
                      "memory as at its capture %s)", self.label, *("ok" if c else "changed" for c in checks))
        return all(checks)

    def _can_replay(self, rec: Recording, args: list) -> bool:
        ok = addresses_unmoved(rec, args)
        for i, ptr in () if ok else rec.addresses.items():
            if args[i].data_ptr() != ptr:
                self.moves[i] += 1
                if i not in self.static and not self._recorded(args[i]) or self.moves[i] > 2:
                    # an input that moves between calls is cheaper copied than recorded anew each time
                    self.copied.add(i)
        # an output over an input is placed relative to that input: its storage must still hold it
        if any(alias_offset(args[o.index], o) is None for o in rec.arg_outputs):
            ok = False
        held = rec.held_outputs()
        self.copy_outputs.update(held)
        if not ok or held:
            log.debug("ember: %s: inputs moved %s, outputs held %s", self.label,
                      [i for i, p in rec.addresses.items() if args[i].data_ptr() != p], held)
        return ok and not held

    @staticmethod
    def _later_outputs_free(rec: Recording) -> bool:
        """Whether no output of a recording made after `rec` in its pool is alive; each current one that has
        some is dropped, its held outputs returned as copies from then on (and `rec` must be recorded anew)."""
        ok = True
        for later in rec.pool.later_than(rec):
            if later.any_alive():
                _drop_recording(later)
                ok = False
        return ok

    @staticmethod
    def _recorded(t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in _recorded_storages

    # -- recording -------------------------------------------------------------------------------------
    def _record(self, entry: _Sizes, args: list):
        dirty = self.pools.current.dirty_recordings()
        if dirty and not entry.deferred:
            # tensors earlier replays returned are alive (a forward's activations, when its backward must be
            # recorded anew): a capture now could not reuse or even see their memory. This call runs
            # uncaptured and those recordings are recorded anew at their next calls, with outputs the
            # allocator owns, so that the graphs keep sharing one pool; if the pool is still dirty next time,
            # the capture goes to a fresh pool
            entry.deferred = True
            pool = self.pools.current
            # and the recordings after them, so that the pool's order stays the order the graphs run in
            for rec in pool.recordings[pool.recordings.index(dirty[0]):]:
                if rec.is_current():
                    rec.runner()._drop(rec.entry())
            log.debug("ember: %s runs uncaptured once; %d recordings of its pool are recorded anew",
                      self.label, len(dirty))
            return self.fn(args)
        entry.deferred = False
        # an input that moved since the warm-up moves every call (a new batch, the previous token): copied;
        # a backward's incoming gradients are read in place until they move again: the warm-up ran before
        # any recording held memory, and in a steady loop the allocator then hands them the same block each
        # step (copying them would cost a copy of the logits' gradient every step)
        self.copied.update(i for i, p in entry.warm_addresses.items()
                           if args[i].data_ptr() != p and not self._recorded(args[i]) and i not in self.settling)
        entry.warm_addresses = {}
        # an input with overlapping elements (an expanded one) has no buffer of its strides to copy into:
        # it is read in place
        buffers = {i: torch.empty_strided(args[i].size(), args[i].stride(), dtype=args[i].dtype,
                                          device=args[i].device).copy_(args[i])
                   for i in self.copied if _dense(args[i])}
        call_args = [buffers.get(i, a) for i, a in enumerate(args)]
        addresses = {i: a.data_ptr() for i, a in enumerate(args)
                     if isinstance(a, torch.Tensor) and i not in buffers}
        # an output over a program's input (read in place) is the program's own memory, which no replay
        # overwrites behind its back; an output over one of the recording's buffers (a graph returns its
        # input: a forward saving it for its backward) is overwritten by the next call's copy-in, so it is
        # watched as the graph's own outputs are. The capture holds no input: an input it frees (a forward's
        # activation, in a backward) lends its memory to what comes after, which is then not over the input
        in_place = {a.untyped_storage().data_ptr(): (i, a.data_ptr(), StorageWeakRef(a.untyped_storage()))
                    for i, a in enumerate(call_args) if isinstance(a, torch.Tensor) and i not in buffers}
        write_back = {i: args[i] for i in self.mutated.intersection(buffers)}
        pool = self.pools.for_capture()
        dead_before, alive_before = pool.memory_at_capture(call_args)
        capture = self.capture_factory(pool)
        fallback_args = _without_pool_references(args, {r.storages[i].ptr for r, i, *_ in alive_before})
        # the capture gets the only references to the inputs: what the graph frees as it runs (a forward's
        # activations, in a backward) is free for it to reuse, as without CUDA graphs
        args.clear()
        try:
            outs = tuple(capture.capture(self.fn, call_args))
        except Exception as e:   # noqa: BLE001 - any capture failure leaves the graph running uncaptured
            self.disabled = f"{type(e).__name__}: {e}"
            warnings.warn(f"ember: recording {self.label} into a CUDA graph failed ({self.disabled}); it runs "
                          f"without CUDA graphs", RuntimeWarning, stacklevel=3)
            return self.fn([_rebuild(*a) if isinstance(a, tuple) else a for a in fallback_args])
        del fallback_args
        outputs, storages = describe_outputs(outs, in_place, {b.untyped_storage().data_ptr() for b in buffers.values()})
        rec = Recording(capture, addresses, buffers, outputs, storages, pool, weakref.ref(self), weakref.ref(entry))
        rec.dead_before = dead_before
        rec.consumed = [c for c in alive_before if not c[0].storages[c[1]].alive()]
        rec.storages_out()
        ptrs = [s.ptr for s in storages]
        _recorded_storages.update(ptrs)
        weakref.finalize(rec, _forget_storages, ptrs)
        entry.recording = rec
        pool.recordings.append(rec)
        metrics.cudagraph_records += 1
        # the capture ran nothing: run it once
        capture.replay(None)
        for i, a in write_back.items():
            a.copy_(buffers[i])
        metrics.cudagraph_replays += 1
        settle_watches(outputs)
        result = []
        for k, (o, spec) in enumerate(zip(outs, outputs)):
            if spec.kind == "buffer":
                o = o.detach()
            elif spec.kind == "pool":
                if k in self.copy_outputs:
                    o = _copy(o)
                else:
                    rec.tensors[k] = weakref.ref(o)
            result.append(o)
        return result

    def _drop(self, entry: _Sizes) -> None:
        entry.recording = None       # the pool keeps it while outputs of it are alive

    # -- replaying -------------------------------------------------------------------------------------
    def _replay(self, rec: Recording, args: list):
        if rec.buffers:
            copy_all([(buf, args[i]) for i, buf in rec.buffers.items() if args[i].data_ptr() != buf.data_ptr()])
        rec.capture.replay([rec.buffers.get(i, a) for i, a in enumerate(args)] if rec.capture.reads_args else None)
        if self.mutated:
            copy_all([(args[i], rec.buffers[i]) for i in self.mutated.intersection(rec.buffers)])
        metrics.cudagraph_replays += 1
        made = [None] * len(rec.storages)
        out = []
        copies, shared, storages = self.copy_outputs, rec.shared_outputs, rec.storages
        for k, o in enumerate(rec.outputs):
            if o.kind == "pool":
                st = made[o.index]
                if st is None:
                    s = storages[o.index]
                    st = _unowned_storage(s.ptr, s.device, s.nbytes)
                t = pool_tensor(st, o, storages[o.index])
                if k in copies:
                    out.append(_copy(t))
                    continue
                made[o.index] = st
                if k in shared:
                    rec.tensors[k] = weakref.ref(t)
                out.append(t)
            elif o.kind == "value":
                out.append(o.value)
            elif o.kind == "buffer":
                out.append(o.value.detach())
            else:
                out.append(input_alias(args[o.index], o))
        args.clear()
        for s, st in zip(rec.storages, made):
            s.ref, s.owned = (StorageWeakRef(st), False) if st is not None else (None, True)
        rec.storages_out()
        return out


# Tests set this: graphs on the CPU then run through EmulatedCapture instead of running as they are.
EMULATE_ON_CPU = False


def _drop_recording(rec: Recording) -> None:
    """Drop `rec` from its runner; outputs of it that are held are returned as copies from then on."""
    if rec.is_current():
        runner = rec.runner()
        runner.copy_outputs.update(rec.held_outputs())
        runner._drop(rec.entry())


def capture_device_type(example_inputs) -> Optional[str]:
    """The device type a graph with these inputs is recorded on: "cuda", "cpu" where tests emulate capture
    (EMULATE_ON_CPU), None where it runs as it is (said once, at info level)."""
    if any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs):
        return "cuda"
    if EMULATE_ON_CPU:
        return "cpu"
    _cpu_note()
    return None


def static_input_indices(gm: torch.fx.GraphModule, kind: str) -> tuple:
    """The inputs of a whole graph that stay where they are between calls (read in place)."""
    if kind == "backward":
        # what a backward graph saved from its forward (activations, parameters) stays where it is between
        # steps; the incoming gradients ("tangents_*") are new tensors each step
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        return tuple(i for i, n in enumerate(placeholders) if not n.name.startswith("tangents"))
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    return tuple(getattr(meta, "static_input_indices", None) or ())


def wrap(fn: Callable, gm: torch.fx.GraphModule, example_inputs, kind: str, static_inputs=None) -> Callable:
    """`fn` run through CUDA graphs where the graph allows it, else `fn` itself (the reason logged).
    `static_inputs` is given for a captured partition of a larger graph (runtime/cudagraph_partition.py):
    the inputs it reads in place; its integer inputs may then depend on data (one recording per value)."""
    device_type = capture_device_type(example_inputs)
    if device_type is None:
        return fn
    if static_inputs is None:
        why = capture_blockers(gm, device_type)
        static_inputs = static_input_indices(gm, kind)
    else:
        from .cudagraph_partition import partition_blockers
        why = partition_blockers(gm, device_type)
    if why:
        log.debug("ember: %s graph runs without CUDA graphs: %s", kind, "; ".join(why))
        return fn
    int_inputs = [i for i, x in enumerate(example_inputs) if isinstance(x, (int, torch.SymInt))]
    device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type == "cuda"),
                  "cpu")
    # a backward's other inputs are its incoming gradients (`static_input_indices`)
    settling = [i for i in range(len(example_inputs)) if i not in static_inputs] if kind == "backward" else ()
    return CudaGraphRunner(fn, static_inputs=static_inputs, mutated=mutated_inputs(gm), int_inputs=int_inputs,
                           settling=settling,
                           label=f"a {kind} graph", capture_factory=CudaCapture if device_type == "cuda"
                           else EmulatedCapture, device=device)


_noted_cpu = False


def _cpu_note() -> None:
    global _noted_cpu
    if not _noted_cpu:
        _noted_cpu = True
        log.info("ember: CUDA graphs need a GPU; graphs on other devices run as they are")
