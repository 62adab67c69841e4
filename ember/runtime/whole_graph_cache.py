"""Whole compiled graphs from AOTAutograd's cache: a warm start that skips AOTAutograd's trace and partition.

ember's graph cache (runtime/graph_cache.py) keys each forward, backward or inference graph that AOTAutograd
hands to ember. By then AOTAutograd has traced the joint graph and partitioned it, which is most of what a
warm start with ember's graph cache alone still spends (BERT-base training: 4.9 s of trace and 4.2 s of
partition, docs/performance.md "First calls: cold and warm"). torch keeps a cache of AOTAutograd's whole
results, keyed by the Dynamo graph, and hands it to a backend whose compilers are
`SerializableAOTDispatchCompiler`s returning picklable `OutputCode`s, with its bundled form on: an entry then
holds AOTAutograd's runtime metadata and the backend's compiled forward and backward, and a hit runs
neither the trace, the partition nor the backend's compilers.

ember's compilers then return an `EmberOutputCode`: the compiled graph, the graph-cache entry (key and bytes)
it was compiled to or loaded from, and the graph it was given. Pickled into AOTAutograd's entry it keeps the
graph-cache entry and the graph (an eager fallback runs it); loaded (`post_compile`) it renders and loads the
entry's program as a hit of the graph cache does, through program_pickle.py's restricted loader. A graph
whose program was not cached (an eager fallback, a graph the graph cache refuses) makes AOTAutograd skip
the entry.

AOTAutograd's key holds the Dynamo graph (after ember's pre-grad passes), the inputs' metadata, grad and
autocast state, torch's settings and versions and, through `torch.compiler.config.cache_key_tag`, `tag()`:
ember's settings, source hash, versions and devices. It is used where that is exact: static sizes (on a hit
AOTAutograd checks its guards but does not install the ones ember added while compiling), no CUDA graphs, no
user joint passes, the graph cache on, a job of one rank (ranks agree on compiling graphs with collectives:
a rank that loaded would not join one that compiles). While ember compiles, AOTAutograd's cache reads and
writes its entries as ember's checked files under `<cache root>/whole/`: an entry that is missing,
truncated, corrupted or does not unpickle is a miss, the graph compiles and its entry is written anew.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import pickle
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..config import NOT_IN_PROGRAM, config
from .cache_dir import WHOLE, cache_root, is_private, read_entry, subfolder, write_entry
from .graph_key import NotCacheable, digest, environment_parts, graph_symbols, installed_versions, settings_text

log = logging.getLogger("ember")

# settings that act before AOTAutograd's cache is looked up: the Dynamo graph it hashes shows the pre-grad
# passes' work; how a loaded graph is rendered and run is read when it is loaded
_NOT_IN_ENTRY = tuple(n for n in NOT_IN_PROGRAM if n not in ("joint_passes", "fused_linear_cross_entropy",
                                                               "linear_cross_entropy_chunk_bytes"))
_loaded: contextvars.ContextVar = contextvars.ContextVar("ember_whole_graphs_loaded", default=None)


try:
    from torch._functorch._aot_autograd import autograd_cache
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache, BypassAOTAutogradCache
    from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
    from torch._inductor import codecache
    from torch._inductor.output_code import OutputCode
    AVAILABLE = hasattr(torch.compiler.config, "cache_key_tag") and all(
        hasattr(AOTAutogradCache, name) for name in ("iterate_over_candidates", "_write_to_local_cache"))
except ImportError:            # a torch without AOTAutograd's bundled cache: ember's graph cache alone
    OutputCode, AVAILABLE = object, False


def tag(gm: torch.fx.GraphModule, example_inputs, cudagraphs: bool) -> Optional[str]:
    """What decides ember's compile of this Dynamo graph besides the graph and torch's state, hashed; None
    (with the reason logged) where whole graphs are not cached. User joint passes (callables) make the
    settings NotCacheable."""
    if cudagraphs or not config.graph_cache or config.debug or not AVAILABLE or not is_private(cache_root()):
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        # ranks agree on compiling a graph with collectives (runtime/rank_agreement.py): a rank whose entry
        # loads would not join a rank that compiles
        log.debug("ember whole-graph cache: not used in a job of several ranks")
        return None
    if any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in example_inputs) or \
            graph_symbols(gm, example_inputs)[0]:
        log.debug("ember whole-graph cache: not used for a graph with symbolic sizes")
        return None
    try:
        parts = environment_parts(gm, example_inputs, settings_text(leave_out=_NOT_IN_ENTRY))
    except NotCacheable as e:
        log.debug("ember whole-graph cache: not used: %s", e)
        return None
    return "ember-" + digest(parts)[:32]


@contextlib.contextmanager
def lookup_and_store(key_tag: str):
    """AOTAutograd's cache on, bundled, with `key_tag` in its key and its entries in ember's cache directory,
    around AOTAutograd's compile of one Dynamo graph; yields the list of the EmberOutputCodes a hit loads.
    The backward compiles with the forward (not at its first call), so that the entry is stored whole."""
    loaded: list = []
    token = _loaded.set(loaded)
    previous = torch.compiler.config.cache_key_tag
    try:
        with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
                torch.compiler.config.patch(cache_key_tag=f"{previous}|{key_tag}" if previous else key_tag), \
                _in_ember_cache():
            yield loaded
    finally:
        _loaded.reset(token)


@contextlib.contextmanager
def _in_ember_cache():
    """While ember compiles, AOTAutograd's cache reads and writes its entries through ember's checked files
    (torch's own files have no checksum, and `ember cache` would not see them), and computes its key without
    importing inductor's code generators (`_key_patches`)."""
    patches = [(AOTAutogradCache, "iterate_over_candidates", classmethod(_candidates)),
               (AOTAutogradCache, "_write_to_local_cache", staticmethod(_write))] + _key_patches()
    own = [(owner, name, vars(owner).get(name)) for owner, name, _ in patches]      # None: inherited
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in own:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def _key_patches() -> list:
    """AOTAutograd's cache key is inductor's FX-graph key. Computing it imports about 200 modules of inductor's
    code generators that ember never runs: `init_backend_registration` registers inductor's device
    backends so that their custom passes enter the key, and the user Triton kernels' sources are read with
    a helper of inductor's wrapper codegen even when the graph calls none. The import costs 0.4 s with
    compiled bytecode and 1.5 s without (a warm start of a small training step on the CPU), in a warm
    start that is otherwise about 1.5 s. While ember compiles, the registration is left out of the key
    (ember runs no inductor device pass; a process that registered them has them in its key, a miss), and
    a graph without user Triton kernels gets its empty list of sources directly. Patched only where torch
    has the functions named here; elsewhere the key is torch's as it stands."""
    patches = []
    if callable(getattr(codecache, "init_backend_registration", None)):
        patches.append((codecache, "init_backend_registration", lambda: None))
    details = getattr(autograd_cache, "AOTAutogradCacheDetails", None)
    original = getattr(details, "get_triton_source_codes_from_gm", None)
    if original is not None and callable(getattr(torch._library.triton, "get_triton_kernels_for_op", None)):
        def triton_sources(self, gm):
            return original(self, gm) if _calls_user_triton_kernels(gm) else []
        patches.append((details, "get_triton_source_codes_from_gm", triton_sources))
    if callable(getattr(codecache, "torch_key", None)):
        patches.append((codecache, "torch_key", _installation_key))
    system = getattr(codecache, "CacheBase", None)
    if callable(getattr(system, "get_system", None)):
        patches.append((system, "get_system", staticmethod(_system)))
    return patches


def _installation_key() -> bytes:
    """torch and Triton in the key by their versions, as in ember's graph key, for inductor's `torch_key` (a
    hash of every source file of torch) and `triton_key` (Triton's, read by `CacheBase.get_system`). Hashing
    those files took 0.5 s of every warm start's first call on an H200 host, on its main thread; a
    background thread does not help, since beside Dynamo's trace, which holds the GIL, it waits a switch
    interval after each file it reads (docs/performance.md, "Warm first calls: what the main thread
    does")."""
    return hashlib.sha256(installed_versions().encode()).digest()


def _system() -> dict:
    return {"device": {"name": None}, "version": {"installation": installed_versions()},
            "hash": _installation_key().hex()}


def _calls_user_triton_kernels(gm: torch.fx.GraphModule) -> bool:
    """Whether a node of `gm` or of a graph inside it calls an op with user Triton kernels (`triton_op`), as
    torch's reader of their sources looks for them."""
    kernels_for = torch._library.triton.get_triton_kernels_for_op
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if isinstance(node.target, torch._ops.OpOverloadPacket):
                overloads = (getattr(node.target, name, None) for name in node.target._dir)
                if any(op is not None and kernels_for(op._name) for op in overloads):
                    return True
            elif isinstance(node.target, torch._ops.OpOverload) and kernels_for(node.target._name):
                return True
    return False


def _path(key: str) -> str:
    return os.path.join(subfolder(WHOLE, key[-2:]), key)


def _candidates(cls, local: bool, remote_cache, key: str):
    """AOTAutograd's lookup of `key`, in ember's cache: the one entry stored under it, if its file is whole."""
    if not local:
        return
    path = _path(key)
    payload = read_entry(path)
    if payload is None:
        return
    try:
        entry = pickle.loads(payload)
    except Exception as e:              # noqa: BLE001  (an entry that does not load is a miss)
        log.debug("ember whole-graph cache: %s does not load (%s); ignored, the graph compiles", path, e)
        return
    yield entry, payload, True


def _write(key: str, content: bytes) -> None:
    write_entry(_path(key), content, config.cache_max_gb)


def serializable(compile_fn, kind: str, direct_dims=None):
    """AOTAutograd's compiler for `kind` whose results AOTAutograd's cache can store: `compile_fn(gm, inputs)`
    -> ember's compiled graph, returned as an EmberOutputCode. `direct_dims(compiled)`, for an inference
    graph: the output dims its direct call marks, or None where it needs AOTAutograd's wrapper."""
    def compile_to_output_code(gm, example_inputs):
        compiled = compile_fn(gm, example_inputs)
        return EmberOutputCode(compiled, kind, gm, direct_dims(compiled) if direct_dims is not None else None)

    return SerializableAOTDispatchCompiler(EmberOutputCode, compile_to_output_code)


class EmberOutputCode(OutputCode):
    """ember's compiled graph as AOTAutograd's cache stores it (see the module's docstring)."""

    def __init__(self, compiled, kind: str, gm: torch.fx.GraphModule, direct_dims=None):
        # an instance attribute: the `disable` wrapper around a backward copies __dict__, not the class's
        self._boxed_call = True
        self.compiled, self.kind, self.gm, self.direct_dims = compiled, kind, gm, direct_dims
        self.cache_entry = getattr(compiled, "cache_entry", None)
        self.gm_bytes: Optional[bytes] = None

    def __call__(self, args):
        return self.compiled(args)

    def prepare_for_serialization(self) -> None:
        # called on a copy, the one AOTAutograd pickles
        if self.cache_entry is None:
            raise BypassAOTAutogradCache(f"ember's {self.kind} graph has no graph-cache entry")
        # the graph is pickled apart and unpickled only if an eager fallback runs it (it rarely does, and its
        # unpickling traces its code again)
        try:
            with unset_fake_temporarily():
                self.gm_bytes = pickle.dumps(self.gm)
        except Exception as e:          # noqa: BLE001  (the loaded graph then has no eager fallback)
            log.debug("ember whole-graph cache: the %s graph does not pickle (%s); stored without it", self.kind, e)
        self.compiled = self.gm = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        from ..compile_graph import load_compiled
        gm_bytes = self.gm_bytes
        self.compiled = load_compiled(self.cache_entry[1], self.cache_entry[0],
                                      (lambda: pickle.loads(gm_bytes)) if gm_bytes is not None else None, self.kind)
        loaded = _loaded.get()
        if loaded is not None:
            loaded.append(self)

    def set_triton_bundle(self, triton_bundle) -> None:
        pass
