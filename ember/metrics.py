"""Counters a user or a test can read: `ember.metrics.generated_kernel_count`, ... and `reset()`."""
from __future__ import annotations

import collections

graphs_compiled = 0
generated_kernel_count = 0
fallbacks: collections.Counter = collections.Counter()   # ATen op name -> times used as an extern fallback
buffers_allocated = 0                                      # buffers the wrappers allocate (per compile)
eager_fallbacks = 0                                        # graphs that failed to compile and ran eagerly
in_place_buffers = 0                                       # kernel outputs written over a dying input's memory
direct_graphs = 0                                          # inference graphs called without AOTAutograd's wrapper
graph_cache_hits = 0                                       # graphs loaded from the on-disk graph cache
graph_cache_misses = 0                                     # graphs compiled while the graph cache was on
compile_seconds = 0.0                                      # time inside ember's compile of graphs (hits too)
compile_stage_seconds: collections.Counter = collections.Counter()   # ... per stage (runtime/compile_profile.py)

# What the pipeline (lowering to code generation) counts: a graph cache hit adds what the compile it
# replaces added.
PIPELINE_COUNTERS = ("fallbacks", "buffers_allocated", "in_place_buffers")


def reset() -> None:
    global graphs_compiled, generated_kernel_count, buffers_allocated, eager_fallbacks, in_place_buffers, direct_graphs
    global graph_cache_hits, graph_cache_misses, compile_seconds
    graphs_compiled = 0
    generated_kernel_count = 0
    buffers_allocated = 0
    eager_fallbacks = 0
    in_place_buffers = 0
    direct_graphs = 0
    graph_cache_hits = 0
    graph_cache_misses = 0
    compile_seconds = 0.0
    fallbacks.clear()
    compile_stage_seconds.clear()


def summary() -> dict:
    return {
        "graphs_compiled": graphs_compiled,
        "generated_kernel_count": generated_kernel_count,
        "fallbacks": dict(fallbacks),
        "buffers_allocated": buffers_allocated,
        "eager_fallbacks": eager_fallbacks,
        "in_place_buffers": in_place_buffers,
        "direct_graphs": direct_graphs,
        "graph_cache_hits": graph_cache_hits,
        "graph_cache_misses": graph_cache_misses,
        "compile_seconds": compile_seconds,
        "compile_stage_seconds": dict(compile_stage_seconds),
    }
