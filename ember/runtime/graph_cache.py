"""Compiled graphs on disk: a graph compiled once, in any process, is loaded by the next instead of compiled.

An entry is a graph's Wrapper IR (its WrapperProgram: lines, kernels' sources and signatures, tuning
candidates, constants), stored under `<cache root>/graphs/ab/<key>` (key: runtime/graph_key.py) as a
checked file (runtime/cache_dir.py: header, checksum, then the program pickled by
runtime/program_pickle.py). A hit renders and loads that program as a compile would, with the Python or
the FX wrapper; the kernels' binaries come from their own caches, found by their source: the C++ shared
library by its source hash (codegen/cpp/build.py), Triton's binaries in Triton's cache, and the autotuning
choices under `autotune/` (runtime/autotune.py), made at a kernel's first call.

Besides the program an entry holds what compiling the graph did outside it, which a hit does again:
- the guards ember installed in the ShapeEnv while compiling (a graph with symbolic sizes decides things
  by its example sizes, under a guard): an entry applies only when each of its guards holds for this
  graph's example sizes, and a hit installs them again, so Dynamo recompiles where a compile would;
- the pipeline's counters (ember.metrics.PIPELINE_COUNTERS).

A file that is missing, truncated, corrupted, from another key or holding something the loader does not
allow is a miss: the graph compiles and its entry is written anew (atomically: concurrent processes
compiling one graph each replace the file with a whole entry). After each write, the least recently used
files are evicted while the cache is larger than `ember.config.cache_max_gb`.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
from typing import Any, Optional

import sympy
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import metrics
from ..config import config
from . import program_pickle
from .cache_dir import GRAPHS, cache_root, is_private, read_entry, subfolder, write_entry
from .graph_key import NotCacheable, graph_key, graph_symbols

log = logging.getLogger("ember")
FORMAT = 1
_warned_roots: set = set()


@dataclasses.dataclass
class CachedGraph:
    program: Any                 # the WrapperProgram
    kernel_count: int


class GraphCache:
    """One graph's entry: `load()` it, or compile and `store(...)` it."""

    def __init__(self, key: str, path: str, env):
        self.key, self.path, self.env = key, path, env
        self.guards_before = len(env.guards) if env is not None else 0
        self.counters_before = _counters()
        self.payload: Optional[bytes] = None     # the entry as stored: what a whole-graph entry embeds

    def load(self) -> Optional[CachedGraph]:
        payload = read_entry(self.path)
        cached = from_payload(payload, self.key, self.env, self.path) if payload is not None else None
        if cached is not None:
            self.payload = payload
        return cached

    def store(self, program, kernel_count: int) -> None:
        try:
            with unset_fake_temporarily():
                self._store(program, kernel_count)
        except Exception:               # noqa: BLE001  (a graph that was not stored compiles next time)
            log.debug("ember graph cache: storing %s failed", self.path, exc_info=True)

    def _store(self, program, kernel_count: int) -> None:
        guards = [g.expr for g in self.env.guards[self.guards_before:]] if self.env is not None else []
        entry = {"format": FORMAT, "key": self.key, "program": program, "kernel_count": kernel_count,
                 "guards": guards, "counters": _counter_changes(self.counters_before)}
        try:
            payload = program_pickle.dumps(entry)
        except NotCacheable as e:
            log.debug("ember graph cache: not storing this graph: %s", e)
            return
        write_entry(self.path, payload, config.cache_max_gb)
        self.payload = payload


def from_payload(payload: bytes, key: str, env=None, where: str = "an entry") -> Optional[CachedGraph]:
    """The cached graph an entry's bytes hold, or None (with a debug log) when they do not load, hold another
    key's graph or were compiled under guards these sizes fail; a hit installs the entry's guards in `env`
    and adds its pipeline counters."""
    try:
        entry = program_pickle.loads(payload)
    except Exception as e:              # noqa: BLE001  (anything the loader refuses is a miss)
        log.debug("ember graph cache: %s does not load (%s); ignored, the graph compiles", where, e)
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        log.debug("ember graph cache: %s holds another graph's entry; ignored, the graph compiles", where)
        return None
    guards = entry["guards"]
    if guards and not _hold(guards, env):
        log.debug("ember graph cache: %s was compiled under guards these sizes fail; the graph compiles", where)
        return None
    for g in guards:
        env.evaluate_expr(g)
    _add_counters(entry["counters"])
    return CachedGraph(entry["program"], entry["kernel_count"])


def lookup(gm, example_inputs, kind: str) -> tuple[Optional[GraphCache], Optional[CachedGraph]]:
    """(the graph's entry, to store it in after compiling, or None when it is not cached; the cached graph
    on a hit, else None). Counts a hit or a miss while the cache is on."""
    if not config.graph_cache:
        return None, None
    cache = cached = None
    try:
        # AOTAutograd calls its compilers under its fake mode: constants are hashed and rebuilt as real tensors
        with unset_fake_temporarily():
            cache = _open(gm, example_inputs, kind)
            cached = cache.load() if cache is not None else None
    except Exception:                   # noqa: BLE001  (the cache never stops a graph from compiling)
        log.debug("ember graph cache: lookup failed; the graph compiles", exc_info=True)
    if cached is None:
        metrics.graph_cache_misses += 1
    else:
        metrics.graph_cache_hits += 1
    return cache, cached


def _open(gm, example_inputs, kind: str) -> Optional[GraphCache]:
    if config.debug:
        log.debug("ember graph cache: not used with ember.config.debug (the dump shows every stage)")
        return None
    root = cache_root()
    if not is_private(root):
        if root not in _warned_roots:
            _warned_roots.add(root)
            log.warning("ember graph cache: %s is not a private directory of this user (other users may write to "
                        "it), so compiled graphs are not cached there; set EMBER_CACHE_DIR to one", root)
        return None
    try:
        if config.post_grad_passes:
            raise NotCacheable("ember.config.post_grad_passes holds passes of your own")
        key = graph_key(gm, example_inputs, kind)
    except NotCacheable as e:
        log.debug("ember graph cache: this %s graph is not cached: %s", kind, e)
        return None
    _, env = graph_symbols(gm, example_inputs)
    return GraphCache(key, os.path.join(subfolder(GRAPHS, key[:2]), key), env)


def _hold(guards: list, env) -> bool:
    """Does every guard hold for the ShapeEnv's example values of its symbols?"""
    if env is None:
        return False
    table = getattr(env, "backed_var_to_val", None)   # torch >= 2.13
    table = env.var_to_val if table is None else table
    for g in guards:
        if not g.free_symbols <= table.keys():
            return False
        if g.xreplace({s: sympy.Integer(int(table[s])) for s in g.free_symbols}) != sympy.true:
            return False
    return True


def _counters() -> dict:
    return {name: collections.Counter(v) if isinstance(v := getattr(metrics, name), collections.Counter) else v
            for name in metrics.PIPELINE_COUNTERS}


def _counter_changes(before: dict) -> dict:
    after = _counters()
    return {name: dict(after[name] - before[name]) if isinstance(after[name], collections.Counter)
            else after[name] - before[name] for name in after}


def _add_counters(changes: dict) -> None:
    for name, change in changes.items():
        current = getattr(metrics, name, None)
        if isinstance(current, collections.Counter):
            current.update(change)
        elif isinstance(current, int) and isinstance(change, int):
            setattr(metrics, name, current + change)
