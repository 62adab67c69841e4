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
cudagraph_records = 0                                      # graphs recorded into a CUDA graph
cudagraph_replays = 0                                      # CUDA graph replays
cudagraph_output_copies = 0                                # outputs returned as copies, being held past a replay
attention_rewrites = 0                                     # hand-written attentions rewritten to SDPA


def reset() -> None:
    global graphs_compiled, generated_kernel_count, buffers_allocated, eager_fallbacks, in_place_buffers, direct_graphs
    global cudagraph_records, cudagraph_replays, cudagraph_output_copies, attention_rewrites
    cudagraph_records = cudagraph_replays = cudagraph_output_copies = attention_rewrites = 0
    graphs_compiled = 0
    generated_kernel_count = 0
    buffers_allocated = 0
    eager_fallbacks = 0
    in_place_buffers = 0
    direct_graphs = 0
    fallbacks.clear()


def summary() -> dict:
    return {
        "graphs_compiled": graphs_compiled,
        "generated_kernel_count": generated_kernel_count,
        "fallbacks": dict(fallbacks),
        "buffers_allocated": buffers_allocated,
        "eager_fallbacks": eager_fallbacks,
        "in_place_buffers": in_place_buffers,
        "direct_graphs": direct_graphs,
        "cudagraph_records": cudagraph_records,
        "cudagraph_replays": cudagraph_replays,
        "cudagraph_output_copies": cudagraph_output_copies,
        "attention_rewrites": attention_rewrites,
    }
