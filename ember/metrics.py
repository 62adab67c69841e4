"""Counters a user or a test can read: `ember.metrics.generated_kernel_count`, ... and `reset()`."""
from __future__ import annotations

import collections

# name -> what it counts; every one starts at zero and `reset()` sets it back
_COUNTS = {
    "graphs_compiled": "graphs compiled (cache hits included)",
    "generated_kernel_count": "kernels generated",
    "buffers_allocated": "buffers the wrappers allocate (per compile)",
    "eager_fallbacks": "graphs that failed to compile and ran eagerly",
    "in_place_buffers": "kernel outputs written over a dying input's memory",
    "scatters_in_place": "scatters written into the graph input they update (a KV cache), not a copy of it",
    "direct_graphs": "inference graphs called without AOTAutograd's wrapper",
    "attention_rewrites": "hand-written attentions rewritten to SDPA",
    "sdpa_mask_copies": "SDPA masks made contiguous so that a fused kernel accepts them",
    "sdpa_masks_dropped": "SDPA masks computed from constants that keep every key, dropped",
    "linear_cross_entropy_rewrites": "cross-entropies of a linear rewritten to chunked linear cross-entropy",
    "deferred_head_logits": "logits returned beside a chunked loss, their backward left outside the graph",
    "cudagraph_records": "graphs recorded into a CUDA graph",
    "cudagraph_replays": "CUDA graph replays",
    "cudagraph_output_copies": "outputs returned as copies, being held past a replay",
    "cudagraph_partitions": "captured partitions of graphs split around what CUDA graphs cannot record",
    "graph_cache_hits": "graphs loaded from the on-disk graph cache",
    "graph_cache_misses": "graphs compiled while the graph cache was on",
    "whole_graph_hits": "Dynamo graphs loaded whole, AOTAutograd's trace and partition included",
    "binaries_loaded": "Triton kernels' first launches that loaded the compile workers' binary without the JIT",
    "template_kernels": "GEMM template kernels generated",
    "fused_epilogue_nodes": "pointwise nodes computed in a GEMM template's epilogue",
    "decomposed_products": "matrix products lowered as a batched template over slices of K and their sum",
    "collective_buckets": "buckets of collectives merged into one (graph/passes/bucket_collectives.py)",
    "collectives_bucketed": "collectives merged into those buckets",
    "flex_attention_kernels": "FlexAttention forward and backward calls compiled to ember's Triton kernels",
    "short_attention_kernels": "fused attention calls with few queries per key/value head run as ember's kernels",
    "combined_kernels": "launches of combined kernels: independent small pointwise kernels run as one",
    "combined_kernel_parts": "the kernels those combined launches run",
}

graphs_compiled = generated_kernel_count = buffers_allocated = eager_fallbacks = in_place_buffers = 0
scatters_in_place = 0
direct_graphs = attention_rewrites = sdpa_mask_copies = sdpa_masks_dropped = 0
cudagraph_records = cudagraph_replays = cudagraph_output_copies = cudagraph_partitions = 0
graph_cache_hits = graph_cache_misses = whole_graph_hits = linear_cross_entropy_rewrites = binaries_loaded = 0
template_kernels = fused_epilogue_nodes = decomposed_products = collective_buckets = collectives_bucketed = 0
flex_attention_kernels = short_attention_kernels = deferred_head_logits = 0
combined_kernels = combined_kernel_parts = 0
compile_seconds = 0.0                                      # time inside ember's compile of graphs (hits too)
fallbacks: collections.Counter = collections.Counter()   # ATen op name -> times used as an extern fallback
collectives: collections.Counter = collections.Counter()  # collective op name -> calls and waits compiled
compile_stage_seconds: collections.Counter = collections.Counter()   # ... per stage (runtime/compile_profile.py)

# What the pipeline (lowering to code generation) counts: a graph cache hit adds what the compile it
# replaces added.
PIPELINE_COUNTERS = ("fallbacks", "collectives", "buffers_allocated", "in_place_buffers", "attention_rewrites",
                     "scatters_in_place", "collective_buckets", "collectives_bucketed", "combined_kernels",
                     "combined_kernel_parts")


def reset() -> None:
    global compile_seconds
    for name in _COUNTS:
        globals()[name] = 0
    compile_seconds = 0.0
    fallbacks.clear()
    collectives.clear()
    compile_stage_seconds.clear()


def summary() -> dict:
    out = {name: globals()[name] for name in _COUNTS}
    out.update(fallbacks=dict(fallbacks), collectives=dict(collectives), compile_seconds=compile_seconds,
               compile_stage_seconds=dict(compile_stage_seconds))
    return out
