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

Outputs. A replay writes its outputs into the memory of the previous replay's outputs. Each call returns
fresh tensors over that memory, and the recording counts how many tensors use each output's storage. When a
replay would overwrite an output the program still holds (the previous token fed back, a list of losses,
logits kept for later), the recording is dropped, the held memory stays with the program, a new recording
is made, and from then on that output is returned as a copy (`ember.metrics.cudagraph_output_copies`).
Outputs that are let go before the next call (activations consumed by the backward, a loss read once) are
never copied.

Memory. The recordings on one device share one memory pool, so that a backward graph's temporaries reuse
the memory of the forward's. A recording may then place its outputs where an earlier recording keeps
temporaries; before a replay, the outputs of every later recording in the pool are checked the same way as
the replaying graph's own (`_Pool`).

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
from typing import Any, Callable, Optional

import torch

from .. import config, metrics

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


def capture_blockers(gm: torch.fx.GraphModule, device_type: str = "cuda") -> list[str]:
    """Why this graph cannot be recorded into a CUDA graph as a whole (empty: it can)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    why: list[str] = []

    def add(reason: str) -> None:
        if reason not in why:
            why.append(reason)

    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.device.type != device_type:
                add(f"{n.name} is a {v.device.type} tensor")
            if isinstance(v, (torch.Tensor, torch.SymInt)) and free_unbacked_symbols(v):
                add(f"{n.name} has a data-dependent size")
        if n.op != "call_function":
            continue
        if n.target in _HOST_SYNC_OVERLOADS:
            add(f"{n.name} ({n.target}) synchronizes with the host")
        tags = getattr(n.target, "tags", ())
        if hasattr(torch.Tag, "cudagraph_unsafe") and torch.Tag.cudagraph_unsafe in tags:
            add(f"{n.name} ({n.target}) is tagged cudagraph_unsafe")
    if config.check_nans:
        add("config.check_nans reads every output on the host")
    if config.debug_sync:
        add("config.debug_sync synchronizes after every call")
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
    """One CUDA graph, recorded into its device's shared memory pool."""

    def __init__(self, pool: "_Pool"):
        self.graph = torch.cuda.CUDAGraph()
        if pool.handle is None or not pool.live():
            # torch releases a pool with the last graph recorded into it: its handle is then stale
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
    recorded outputs' memory, as a CUDA graph's replay does. It holds no input, as a CUDA graph holds none."""

    reads_args = True

    def __init__(self, pool: "_Pool"):
        pass

    def capture(self, fn: Callable, args: list):
        # a capture runs nothing: the inputs the function writes into must come out unchanged; and as with
        # a CUDA graph, an output that is an input is that input's memory
        self.fn = fn
        storages = {a.untyped_storage().data_ptr(): a.untyped_storage() for a in args if isinstance(a, torch.Tensor)}
        before = {p: st.clone() for p, st in storages.items()}
        self.outs = fn(list(args))
        for p, st in storages.items():
            st.copy_(before[p])
        return self.outs

    def replay(self, args: list) -> None:
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for old, new in zip(self.outs, self.fn(args)):
            # an output that is an input's memory is already what the graph returns; the others are written
            # as a CUDA graph writes them, unseen by autograd's version counters (`.data`)
            if isinstance(old, torch.Tensor) and old.untyped_storage().data_ptr() not in inputs:
                old.data.copy_(new)


@dataclasses.dataclass(eq=False)
class _Recording:
    capture: Any
    addresses: dict            # index of an input used in place -> its data_ptr when recorded
    buffers: dict              # index of a copied input -> the recording's buffer for it
    outputs: tuple
    storages: list             # per output: (storage handle, use count of the recording alone) or None
    runner: Any = None         # weak references to the runner and its _Sizes entry that hold this recording
    entry: Any = None
    pool: Any = None

    def held_outputs(self) -> list:
        """The outputs something besides the recording still uses."""
        return [k for k, h in enumerate(self.storages) if h is not None and _use_count(h[0]) > h[1]]


class _Pool:
    """The memory pool one device's recordings share, and those recordings in the order they were made.
    A recording may place its outputs in memory an earlier recording used for temporaries, so replaying a
    recording writes wherever a later one's outputs may lie: before it replays, those must not be held."""

    def __init__(self):
        self.handle = None
        self.recordings: list = []       # weak references, oldest first

    def live(self) -> list:
        """The recordings still alive, oldest first."""
        live = [r for r in (w() for w in self.recordings) if r is not None]
        self.recordings = [weakref.ref(r) for r in live]
        return live

    def later_than(self, rec: _Recording) -> list:
        live = self.live()
        return live[live.index(rec) + 1:] if rec in live else []


_pools: dict = collections.defaultdict(_Pool)      # device -> its pool


@dataclasses.dataclass
class _Sizes:
    warmed: bool = False
    warm_addresses: dict = dataclasses.field(default_factory=dict)   # input index -> data_ptr at the warm-up
    recording: Optional[_Recording] = None


_use_count = getattr(torch._C, "_storage_Use_Count", None)


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
                 capture_factory: Callable = CudaCapture, device="cpu"):
        self._boxed_call = True
        self.fn, self.label, self.capture_factory = fn, label, capture_factory
        self.pool = _pools[str(device)]
        self.static = frozenset(static_inputs)
        self.mutated = frozenset(mutated)
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
        key = tuple(args[i] for i in self.int_inputs)
        entry = self.sizes.get(key)
        if entry is None:
            self._add_sizes(key).warm_addresses = {i: a.data_ptr() for i, a in enumerate(args)
                                                   if isinstance(a, torch.Tensor)}
            return self.fn(args)              # warm-up: kernels compile and tune for these sizes
        self.sizes.move_to_end(key)
        rec = entry.recording
        if rec is not None and not (self._can_replay(rec, args) & self._later_outputs_free(rec)):
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

    def _can_replay(self, rec: _Recording, args: list) -> bool:
        ok = True
        for i, ptr in rec.addresses.items():
            if args[i].data_ptr() != ptr:
                ok = False
                self.moves[i] += 1
                if i not in self.static and not self._recorded(args[i]) or self.moves[i] > 2:
                    # an input that moves between calls is cheaper copied than recorded anew each time
                    self.copied.add(i)
        held = rec.held_outputs()
        self.copy_outputs.update(held)
        return ok and not held

    def _later_outputs_free(self, rec: _Recording) -> bool:
        """Whether no output of a recording made after `rec` in its pool is held; each one that is gets
        dropped, its held outputs returned as copies from then on (and `rec` must be recorded anew)."""
        ok = True
        for later in rec.pool.later_than(rec):
            if later.held_outputs():
                _drop_recording(later)
                ok = False
        return ok

    @staticmethod
    def _recorded(t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in _recorded_storages

    # -- recording -------------------------------------------------------------------------------------
    def _record(self, entry: _Sizes, args: list):
        # an input that moved since the warm-up moves every call (a new batch, the previous token): copied
        self.copied.update(i for i, p in entry.warm_addresses.items()
                           if args[i].data_ptr() != p and not self._recorded(args[i]))
        entry.warm_addresses = {}
        # an input with overlapping elements (an expanded one) has no buffer of its strides to copy into:
        # it is read in place
        buffers = {i: torch.empty_strided(args[i].size(), args[i].stride(), dtype=args[i].dtype,
                                          device=args[i].device).copy_(args[i])
                   for i in self.copied if _dense(args[i])}
        call_args = [buffers.get(i, a) for i, a in enumerate(args)]
        addresses = {i: a.data_ptr() for i, a in enumerate(args)
                     if isinstance(a, torch.Tensor) and i not in buffers}
        capture = self.capture_factory(self.pool)
        try:
            outs = capture.capture(self.fn, list(call_args))
        except Exception as e:   # noqa: BLE001 - any capture failure leaves the graph running uncaptured
            self.disabled = f"{type(e).__name__}: {e}"
            warnings.warn(f"ember: recording {self.label} into a CUDA graph failed ({self.disabled}); it runs "
                          f"without CUDA graphs", RuntimeWarning, stacklevel=3)
            return self.fn(args)
        outs = tuple(outs)
        # an output over a program's input (read in place) is the program's own memory, which no replay
        # overwrites behind its back; an output over one of the recording's buffers (a graph returns its
        # input: a forward saving it for its backward) is overwritten by the next call's copy-in, so it is
        # watched as the graph's own outputs are
        in_place = {a.untyped_storage().data_ptr() for i, a in enumerate(call_args)
                    if isinstance(a, torch.Tensor) and i not in buffers}
        storages = []
        for o in outs:
            if isinstance(o, torch.Tensor) and _use_count is not None and \
                    o.untyped_storage().data_ptr() not in in_place:
                storages.append(o.untyped_storage()._cdata)
            else:
                storages.append(None)
        rec = _Recording(capture, addresses, buffers, outs, [], weakref.ref(self), weakref.ref(entry), self.pool)
        ptrs = [o.untyped_storage().data_ptr() for s, o in zip(storages, outs) if s is not None]
        _recorded_storages.update(ptrs)
        rec.release = weakref.finalize(rec, _forget_storages, ptrs)
        # the counts of the recording's own references, taken once nothing else holds the outputs
        rec.storages = [(s, _use_count(s)) if s is not None else None for s in storages]
        entry.recording = rec
        self.pool.recordings.append(weakref.ref(rec))
        metrics.cudagraph_records += 1
        return self._replay(rec, args)

    def _drop(self, entry: _Sizes) -> None:
        rec, entry.recording = entry.recording, None
        if rec is not None:
            rec.release()
            self.pool.recordings = [w for w in self.pool.recordings if w() is not rec]

    # -- replaying -------------------------------------------------------------------------------------
    def _replay(self, rec: _Recording, args: list):
        for i, buf in rec.buffers.items():
            a = args[i]
            if a.data_ptr() != buf.data_ptr():
                buf.copy_(a)
        rec.capture.replay([rec.buffers.get(i, a) for i, a in enumerate(args)] if rec.capture.reads_args else None)
        for i in self.mutated.intersection(rec.buffers):
            args[i].copy_(rec.buffers[i])
        args.clear()
        metrics.cudagraph_replays += 1
        out = []
        for k, o in enumerate(rec.outputs):
            if not isinstance(o, torch.Tensor):
                out.append(o)
            elif k in self.copy_outputs:
                out.append(torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=o.device).copy_(o))
                metrics.cudagraph_output_copies += 1
            else:
                out.append(o.detach())
        return out


# Tests set this: graphs on the CPU then run through EmulatedCapture instead of running as they are.
EMULATE_ON_CPU = False


def _drop_recording(rec: _Recording) -> None:
    """Drop `rec` from its runner; outputs of it that are held are returned as copies from then on."""
    runner, entry = rec.runner(), rec.entry()
    if runner is not None and entry is not None and entry.recording is rec:
        runner.copy_outputs.update(rec.held_outputs())
        runner._drop(entry)


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
    return CudaGraphRunner(fn, static_inputs=static_inputs, mutated=mutated_inputs(gm), int_inputs=int_inputs,
                           label=f"a {kind} graph", capture_factory=CudaCapture if device_type == "cuda"
                           else EmulatedCapture, device=device)


_noted_cpu = False


def _cpu_note() -> None:
    global _noted_cpu
    if not _noted_cpu:
        _noted_cpu = True
        log.info("ember: CUDA graphs need a GPU; graphs on other devices run as they are")
