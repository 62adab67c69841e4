"""The memory of CUDA-graph recordings: which outputs a replay returns and how, which of them the program
still holds, and when a replay would overwrite memory something else still uses (runtime/cudagraphs.py).

Recordings do not own their outputs. A recording's outputs live in its device's memory pool. The call
that records a graph returns the tensors the capture made, owned by the caching allocator like any
tensor; a replay returns new tensors over the same memory, built from its address and owned by nobody
(`_construct_storage_from_data_pointer`). When the program lets go of an output, its memory is free for
the next capture into the pool, and a backward graph's capture reuses the memory of the activations it
consumes, as the same graphs do without CUDA graphs.

That sharing is safe as long as each replay finds memory as its capture did. Per recording:
- its own outputs from the last call must be let go (else they are returned as copies from then on);
- outputs of earlier recordings that were let go when it was captured must still be let go (`dead_before`);
- outputs of earlier recordings that its capture consumed (a forward's activations, freed during the
  backward's capture) must be held by nothing but the call's own arguments (`consumed`);
- outputs of later recordings in the pool must be let go (a later capture may have placed them where this
  one keeps temporaries).
When a check fails the recording is captured anew, with the held memory left alone.

A capture must see every tensor that lives in the pool as allocated. Tensors a replay returned are not
owned by the allocator, so a pool where any of them is alive takes no capture (`Pool.dirty`): the runner
runs uncaptured once and has those recordings redone with owned outputs, and if the pool is still dirty
at its next call the capture goes to a fresh pool. A recording that is dropped while outputs of its
replays are alive stays in its pool's list (`Pool.prune`): it keeps the pool's memory reserved and its
outputs checked.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_use_count = getattr(torch._C, "_storage_Use_Count", None)
# torch's C++ loop over inputs' addresses (CUDA builds): a replay of a graph with a few hundred parameters
# checks them all before its launch, which in Python costs tens of microseconds the GPU waits for
_ptrs_at_indices_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_data_ptr = torch.Tensor.data_ptr


def addresses_unmoved(rec: "Recording", args: list) -> bool:
    """Whether every input `rec` reads in place is where it was when `rec` was captured."""
    if _ptrs_at_indices_equal is not None and type(args) is list:
        return _ptrs_at_indices_equal(args, rec.ptr_at_index, rec.address_indices)
    return list(map(_data_ptr, map(args.__getitem__, rec.address_indices))) == rec.address_ptrs


@dataclasses.dataclass(eq=False)
class PoolStorage:
    """One block of pool memory that a recording's outputs use."""
    ptr: int
    nbytes: int
    device: torch.device
    ref: Optional[StorageWeakRef] = None     # the storage last returned over it (None: none is out)
    owned: bool = True                       # that storage is the allocator's (the capture's own tensor)

    def alive(self) -> bool:
        if self.ref is None:
            return False
        return _use_count(self.ref.cdata) > 0 if _use_count is not None else not self.ref.expired()

    def alive_unowned(self) -> bool:
        return not self.owned and self.alive()

    def use_count(self) -> int:
        return _use_count(self.ref.cdata) if self.ref is not None else 0


@dataclasses.dataclass(eq=False)
class Output:
    """How a call returns one output. kind "value": `value` itself (not a tensor, or empty); "arg": a view of
    input `index`'s storage (an output over an input read in place); "buffer": `value`, a view of one of
    the recording's copy-in buffers, watched by its storage's use count; "pool": a view of the recording's
    pool storage `index`."""
    kind: str
    value: Any = None
    index: int = -1
    view: tuple = ()         # dtype, storage offset, size, stride
    watch: Any = None        # "buffer": (storage handle, use count of the recording alone)
    meta: Optional[dict] = None   # "pool": what torch's C++ constructor of the tensor takes (pool_tensor)


# torch's C++ constructor of a CUDA tensor over a storage (CUDA builds): a replay builds every output with it
_cuda_tensor_over = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)


def view_of(storage, view: tuple, device) -> torch.Tensor:
    dtype, offset, size, stride = view
    return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, size, stride)


def alias_offset(a: torch.Tensor, out: "Output") -> Optional[int]:
    """The storage offset, in elements, of the output `out` over input `a`'s memory, placed relative to `a`
    as at the capture (its `view` holds the byte distance from `a`'s first element); None where `a`'s
    storage does not hold it."""
    dtype, delta, size, stride = out.view
    st = a.untyped_storage()
    start = a.data_ptr() - st.data_ptr() + delta
    itemsize = dtype.itemsize
    if start < 0 or start % itemsize:
        return None
    extent = (1 + sum((n - 1) * d for n, d in zip(size, stride))) * itemsize if all(size) else 0
    return start // itemsize if start + extent <= st.nbytes() else None


def input_alias(a: torch.Tensor, out: "Output") -> torch.Tensor:
    """The output `out` over input `a`'s memory (`alias_offset` has found it fits)."""
    dtype, _, size, stride = out.view
    return view_of(a.untyped_storage(), (dtype, alias_offset(a, out), size, stride), a.device)


def pool_tensor(storage, out: "Output", block: "PoolStorage") -> torch.Tensor:
    """A tensor over `storage` (made over `block`) as the output `out` is."""
    if _cuda_tensor_over is None or block.device.type != "cuda":
        return view_of(storage, out.view, block.device)
    if out.meta is None:
        dtype, offset, size, stride = out.view
        out.meta = {"nbytes": block.nbytes, "data_ptr": block.ptr, "size": size, "stride": stride,
                    "dtype": dtype, "device": block.device, "storage_offset": offset}
    return _cuda_tensor_over(out.meta, storage)


def view_spec(t: torch.Tensor) -> tuple:
    return (t.dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()))


def describe_outputs(outs, in_place: dict, buffer_ptrs: set) -> tuple[list, list]:
    """The Output of each of a capture's outputs, and the pool storages they use. `in_place`: storage address
    -> (index, data_ptr, weak reference to its storage) of an input read in place; `buffer_ptrs`: the
    storage addresses of the copy-in buffers."""
    outputs, storages, index_of = [], [], {}
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
            outputs.append(Output("value", o))
            continue
        st = o.untyped_storage()
        ptr = st.data_ptr()
        if ptr in in_place and not in_place[ptr][2].expired():
            i, a_ptr, _ = in_place[ptr]
            outputs.append(Output("arg", index=i, view=(o.dtype, o.data_ptr() - a_ptr, tuple(o.size()),
                                                        tuple(o.stride()))))
        elif ptr in buffer_ptrs:
            outputs.append(Output("buffer", o, watch=st._cdata if _use_count is not None else None))
        else:
            if ptr not in index_of:
                index_of[ptr] = len(storages)
                storages.append(PoolStorage(ptr, st.nbytes(), o.device, StorageWeakRef(st), owned=True))
            outputs.append(Output("pool", index=index_of[ptr], view=view_spec(o)))
    return outputs, storages


def settle_watches(outputs: list) -> None:
    """The use counts of the buffer views the recording itself keeps, taken once nothing else holds them."""
    for o in outputs:
        if o.kind == "buffer" and o.watch is not None:
            o.watch = (o.watch, _use_count(o.watch))


@dataclasses.dataclass(eq=False)
class Recording:
    capture: Any
    addresses: dict            # index of an input used in place -> its data_ptr when recorded
    buffers: dict              # index of a copied input -> the recording's buffer for it
    outputs: list              # Output per output
    storages: list             # PoolStorage per block of pool memory the outputs use
    pool: "Pool"
    runner: Any = None         # weak references to the runner and its size entry that hold this recording
    entry: Any = None
    tensors: dict = dataclasses.field(default_factory=dict)      # output index -> weak reference to it
    dead_before: list = dataclasses.field(default_factory=list)   # (recording, its storage indices)
    # (recording, storage index, input indices, references besides the inputs' when captured): the
    # latter are torch's own (a storage's Python object, kept while the storage lives)
    consumed: list = dataclasses.field(default_factory=list)
    # the weak references' handles of the storages out now: liveness of them all in one pass (`any_alive`),
    # which every replay of every recording of the pool asks
    out_refs: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.address_indices, self.address_ptrs = list(self.addresses), list(self.addresses.values())
        # the same addresses by input index (None where an input is not read in place), as torch's C++
        # check of many inputs' addresses at once takes them (`addresses_unmoved`)
        self.ptr_at_index = [None] * (max(self.addresses, default=-1) + 1)
        for i, p in self.addresses.items():
            self.ptr_at_index[i] = p
        self.arg_outputs = [o for o in self.outputs if o.kind == "arg"]
        # the outputs that share their storage with another: which of those the program holds is told by
        # a weak reference to each (`held_outputs`)
        per_storage = collections.Counter(o.index for o in self.outputs if o.kind == "pool")
        self.shared_outputs = {k for k, o in enumerate(self.outputs) if o.kind == "pool" and per_storage[o.index] > 1}
        self.watched_buffers = any(o.kind == "buffer" and o.watch is not None for o in self.outputs)

    def storages_out(self) -> None:
        """Take note of the storages now returned over the recording's memory (after a call)."""
        self.out_refs = [s.ref.cdata for s in self.storages if s.ref is not None]

    def held_outputs(self) -> list:
        """The outputs something besides the recording still uses. Of several outputs over one storage, those
        whose tensors are alive (a saved activation that is also returned: the program holds the one it
        got, autograd the other's storage); all of them when none is (a view of one holds it)."""
        if not self.watched_buffers and not self.any_alive():
            return []
        held, on_storage = [], collections.defaultdict(list)
        for k, o in enumerate(self.outputs):
            if o.kind == "pool" and self.storages[o.index].alive():
                on_storage[o.index].append(k)
            elif o.kind == "buffer" and o.watch is not None and _use_count(o.watch[0]) > o.watch[1]:
                held.append(k)
        for ks in on_storage.values():
            alive = [k for k in ks if self.tensors.get(k) is not None and self.tensors[k]() is not None]
            held.extend(alive or ks)
        return sorted(held)

    def any_alive(self) -> bool:
        if _use_count is not None:
            return any(map(_use_count, self.out_refs))
        return any(s.alive() for s in self.storages)

    def memory_as_recorded(self, args: list) -> bool:
        """Whether earlier recordings' outputs are as this recording's capture found them (module docstring)."""
        for rec, indices in self.dead_before:
            if rec.any_alive() and any(rec.storages[i].alive() for i in indices):
                return False
        for rec, i, inputs, others in self.consumed:
            uses = rec.storages[i].use_count()
            if uses and uses - (len(inputs) if len(inputs) < 2 else len({id(args[j]) for j in inputs})) > others:
                return False
        return True

    def is_current(self) -> bool:
        runner, entry = self.runner(), self.entry()
        return runner is not None and entry is not None and entry.recording is self


class Pool:
    """A memory pool the recordings of one device share, and those recordings in the order they were made
    (held while they are current or their outputs are alive)."""

    def __init__(self):
        self.handle = None
        self.recordings: list = []

    def prune(self) -> list:
        """Forget recordings that are neither current nor have outputs alive; the rest, oldest first."""
        self.recordings = [r for r in self.recordings if r.is_current() or r.any_alive()]
        return self.recordings

    def later_than(self, rec: Recording) -> list:
        recs = self.prune()
        return recs[recs.index(rec) + 1:] if rec in recs else []

    def dirty(self) -> bool:
        """Whether a tensor a replay returned lives in the pool: the allocator does not know it is in use."""
        return bool(self.dirty_recordings())

    def dirty_recordings(self) -> list:
        """The recordings with tensors a replay returned alive."""
        return [r for r in self.prune() if r.any_alive() and any(s.alive_unowned() for s in r.storages)]

    def memory_at_capture(self, call_args: list):
        """Before a capture: the earlier recordings' storages that are let go, and those that are alive, each
        with the indices of the inputs over it and how many other references it has."""
        by_ptr = collections.defaultdict(list)
        for i, a in enumerate(call_args):
            if isinstance(a, torch.Tensor):
                by_ptr[a.untyped_storage().data_ptr()].append(i)
        dead, alive = [], []
        for r in self.prune():
            dead_here = []
            for i, s in enumerate(r.storages):
                if s.alive():
                    inputs = tuple(by_ptr.get(s.ptr, ()))
                    alive.append((r, i, inputs, s.use_count() - len({id(call_args[j]) for j in inputs})))
                else:
                    dead_here.append(i)
            if dead_here:
                dead.append((r, dead_here))
        return dead, alive


class DevicePools:
    """The pool a device's next capture goes to: a fresh one once the current one is dirty."""

    def __init__(self):
        self.current = Pool()

    def for_capture(self) -> Pool:
        # an empty pool is replaced too: torch releases a pool with the last graph recorded into it, and its
        # handle is then stale
        if self.current.dirty() or not self.current.prune():
            self.current = Pool()
        return self.current


pools: dict = collections.defaultdict(DevicePools)      # device -> its pools
