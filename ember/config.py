"""ember's settings: one typed object, overridable from EMBER_* environment variables and with
`ember.config.patch(name=value, ...)` (a context manager and decorator).

    import ember
    ember.config.fallback_on_error = False          # raise instead of running eagerly
    with ember.config.patch(debug=True): ...
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Optional


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return default if v is None or v == "" else float(v)


def _env_bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.lower() not in ("0", "false", "no", "off")


@dataclasses.dataclass
class Config:
    # A graph that fails to compile runs eagerly with one warning; False raises that error instead.
    fallback_on_error: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_FALLBACK_ON_ERROR", True))
    # Write a folder per compiled graph (FX graphs, IR, kernels, wrapper) under debug_dir.
    debug: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_DEBUG", False))
    debug_dir: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_DEBUG_DIR", "ember_debug"))
    # Synchronize the GPU after every kernel and extern call of the Python wrapper and name the call that
    # left an error: a CUDA fault otherwise surfaces at some later launch or copy (slow; for hunting faults).
    debug_sync: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_DEBUG_SYNC", False))
    # Check every floating output of every kernel and extern call for NaN and Inf as it is written (one
    # device reduction and sync per call) and raise EmberNanError naming the first call that made one, its
    # FX nodes and the user's source line. Graph inputs are not checked, nor graph inputs a call updates in
    # place; an op whose eager result holds NaN (log of a negative number) raises too. Nothing is emitted when off.
    check_nans: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_CHECK_NANS", False))
    # Write a self-contained HTML page to this path when the program ends (`ember report script.py` sets it):
    # each compiled graph, its fusion groups, and each kernel and extern call with its bytes, FLOPs and
    # profiled time against the machine's measured rooflines (ember/report/). With it set, the wrappers
    # open a profiler range around each device call; nothing is emitted when it is None.
    report: Optional[str] = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_REPORT") or None)
    # The steps the report profiles: a step runs from one call of the first graph the program calls to its
    # next; profiling starts at that graph's call report_warmup + 1.
    report_steps: int = dataclasses.field(default_factory=lambda: int(os.environ.get("EMBER_REPORT_STEPS", "3")))
    report_warmup: int = dataclasses.field(default_factory=lambda: int(os.environ.get("EMBER_REPORT_WARMUP", "2")))
    # Kernel backend for CPU tensors: "cpp" (C++/OpenMP, built with the system compiler) or "triton"
    # (Triton kernels in Triton's interpreter: slow, for testing the Triton code path without a GPU).
    cpu_backend: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_CPU_BACKEND", "cpp"))
    # Wrapper renderer: "python" source.
    wrapper: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_WRAPPER", "python"))
    # With wrapper="fx": the FxWrapper subclass that compiles the rendered GraphModule (None: FxWrapper,
    # which runs it as is). Out-of-tree backends plug in here by overriding compile_graph(gm).
    fx_wrapper_class: Any = None
    # Check the size and stride of every extern (ATen fallback) output at run time (about 1 us each): an op
    # whose meta function disagrees with its real kernel then fails loudly instead of being misread.
    check_extern_layouts: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_CHECK_EXTERN_LAYOUTS", True))
    # Layouts of 2-D convolutions and the values between them (graph/passes/conv_layout.py): "auto" runs
    # them channels-last where the device's convolution library prefers it, "channels_last" always,
    # "as_traced" in the layouts eager gives.
    conv_layout: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_CONV_LAYOUT", "auto"))
    # Fusion switches.
    fuse: bool = True
    horizontal_fusion: bool = True
    # Independent small pointwise kernels (an optimizer step's per-parameter updates) launch as one combined
    # kernel where the backend renders them (schedule/combine.py).
    combine_kernels: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_COMBINE_KERNELS", True))
    # A pointwise value read by several consumers is recomputed by each (inlined) unless its body has
    # more than this many ops; then it is stored once and loaded.
    inline_max_ops: int = 24
    inline_max_reads: int = 2
    # Any pointwise body larger than this is realized, to bound kernel size.
    realize_max_ops: int = 160
    # Time a few block-size / warp configs of each large GPU kernel on its first call and keep the fastest
    # (cached on disk); False uses the heuristic's choice (codegen/triton/heuristics.py).
    autotune: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_AUTOTUNE", True))
    # Matrix products (mm, addmm, bmm) as ember's own GEMM template kernels, their pointwise consumers fused
    # into the tile before it is stored (codegen/triton/gemm_template.py): "auto" where the backend's timing,
    # when the graph is compiled, finds the template (with its epilogue) faster than the library call plus a
    # separate epilogue kernel (codegen/triton/product_choice.py; `torch.compile(mode="max-autotune")` sets
    # it), "matvec" (the default mode) only where the backend knows the template faster without timing
    # (row-vector products on a GPU: decoding's linear layers), "epilogues" as "auto" for the products whose
    # epilogue runs a costly one-operand op (GELU, SiLU, tanh ...) and the 1x1 convolutions with a pointwise
    # reader, and as "matvec" for the others, "always" for
    # every supported product (tests), "never" (library calls only).
    gemm_templates: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_GEMM_TEMPLATES", "matvec"))
    # Products of a small output and a long K (256 x 256 x 65536) as a batched template product over splits of
    # K, each split's float32 partial product stored, then their sum (a reduction kernel, into which the
    # epilogue fuses): "auto" where gemm_templates="auto" timed it fastest, "always" for every product of
    # the template whose K splits (tests), "never".
    decompose_k: str = dataclasses.field(default_factory=lambda: os.environ.get("EMBER_DECOMPOSE_K", "auto"))
    # Worker processes that compile a GPU graph's Triton kernels in parallel before its first call
    # (runtime/compile_pool.py); None: one per CPU core, up to 16; 0 or 1: each kernel compiles at its
    # first launch, in this process.
    compile_workers: Optional[int] = dataclasses.field(
        default_factory=lambda: int(os.environ["EMBER_COMPILE_WORKERS"]) if "EMBER_COMPILE_WORKERS" in os.environ else None)
    # Launch a compiled Triton kernel through its own launcher once its specialization has been seen
    # (runtime/launch.py): several us less host time per launch than Triton's JIT path.
    fast_launch: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_FAST_LAUNCH", True))
    # ... and, where torch has one, through torch's C launcher instead of Triton's (runtime/static_launch.py)
    static_launch: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_STATIC_LAUNCH", True))
    # Call an inference graph without AOTAutograd's runtime wrapper when that wrapper has nothing to do
    # (runtime/direct_call.py): a third less host time per call of a small graph.
    direct_inference_call: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_DIRECT_CALL", True))
    # Issue each collective as early as its inputs allow and wait for it just before its first reader, so
    # that compute overlaps communication (schedule/overlap.py).
    overlap_collectives: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_OVERLAP_COLLECTIVES", True))
    # ... holding at most this many bytes of collectives' inputs and outputs in flight while other work runs:
    # a collective that does not fit is issued later, one larger than it all is waited for at once.
    overlap_memory_budget_bytes: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("EMBER_OVERLAP_MEMORY_BUDGET_BYTES", 1 << 30)))
    # Merge independent collectives of one kind and group into one of up to this many input bytes
    # (graph/passes/bucket_collectives.py); 0 turns bucketing off.
    collective_bucket_bytes: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("EMBER_COLLECTIVE_BUCKET_BYTES", 25 << 20)))
    # A misaligned 16-bit matrix product whose operand is a graph input of 256 MiB or more (a backward's
    # logits gradient) copies a chunk of it at a time into an aligned buffer instead of padding it whole
    # (graph/passes/post_grad.py); the two products of an LM head's backward share one loop over its column
    # chunks. A logits-sized buffer less at the backward's peak: on an H200, GPT-2's step with its own loss
    # peaked at 4.79 GiB instead of 5.17 in the same time (27.1 against 27.2-27.4 ms), and GPT-2's step with
    # its loss outside the graph took 32.8 / 32.8 ms on against 33.0 / 32.5 off (docs/performance.md).
    chunked_input_pads: bool = dataclasses.field(
        default_factory=lambda: _env_bool("EMBER_CHUNKED_INPUT_PADS", True))
    # Reductions whose row fits in this many elements keep the whole row in registers (persistent).
    persistent_reduction_max: int = 16384
    # Keep compiled graphs on disk (runtime/graph_cache.py) and reuse them in later processes: a graph
    # compiled before, with the same settings and ember, skips its whole compile.
    graph_cache: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_GRAPH_CACHE", True))
    # The on-disk cache's size limit in GB: past it, the least recently used files are removed.
    cache_max_gb: float = dataclasses.field(default_factory=lambda: _env_float("EMBER_CACHE_MAX_GB", 10.0))
    # Print a table per compiled graph on stderr: seconds per compile stage (runtime/compile_profile.py).
    compile_profile: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_COMPILE_PROFILE", False))
    # No progress line on stderr while a long compile runs (it shows only on a terminal; runtime/progress.py).
    quiet: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_QUIET", False))
    # Rewrite cross_entropy(linear(x, W, b), target) into ember::linear_cross_entropy, which computes the loss
    # and its gradients in chunks, never holding the whole logits' fp32 copy, softmax or gradient
    # (graph/passes/linear_cross_entropy.py); a chunk's working set takes about
    # linear_cross_entropy_chunk_bytes. On an H100, Hugging Face Llama's training step with its own loss:
    # peak 5.38 -> 4.63 GiB, 21.8 -> 22.2 ms (docs/performance.md, "LM heads").
    fused_linear_cross_entropy: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_FUSED_LINEAR_CROSS_ENTROPY", True))
    linear_cross_entropy_chunk_bytes: int = 256 << 20
    # The partition of a training graph (AOTAutograd's min-cut) may recompute in the backward a pointwise
    # value that the backward reads only through a matrix product or another op no kernel fuses (a
    # normalization's output, SwiGLU's or GELU's output, a weight's autocast copy), where that saves fewer
    # bytes between forward and backward. torch's partitioner bans it (`ban_recompute_materialized_backward`):
    # such a value must be written again in the backward; ember's backward kernels recompute it where they
    # read its inputs anyway (a norm's backward, an activation's). save_weight_casts keeps the low-precision
    # copies of parameters saved (recomputing them reads every fp32 weight again in the backward).
    recompute_product_operands: bool = dataclasses.field(
        default_factory=lambda: _env_bool("EMBER_RECOMPUTE_PRODUCT_OPERANDS", True))
    save_weight_casts: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_SAVE_WEIGHT_CASTS", True))
    # A training graph draws each dropout mask its backward reads as bits, eight elements to a byte (two
    # Philox draws per byte), and keeps those for the backward instead of a bool byte per element
    # (graph/passes/packed_masks.py).
    packed_dropout_masks: bool = dataclasses.field(
        default_factory=lambda: _env_bool("EMBER_PACKED_DROPOUT_MASKS", True))
    # SDPA forwards with few query rows per key/value head (a decoding step) run as the backend's own kernels
    # where it has them (lowering/short_attention.py); False: the fused ATen op eager picked.
    short_query_attention: bool = dataclasses.field(
        default_factory=lambda: _env_bool("EMBER_SHORT_QUERY_ATTENTION", True))
    # Extra FX passes users add; each is a callable(torch.fx.GraphModule) -> None (mutates in place).
    pre_grad_passes: list = dataclasses.field(default_factory=list)
    joint_passes: list = dataclasses.field(default_factory=list)
    post_grad_passes: list = dataclasses.field(default_factory=list)

    def patch(self, **changes: Any) -> "_Patch":
        for k in changes:
            if not hasattr(self, k):
                raise AttributeError(f"ember.config has no setting {k!r}; settings: {', '.join(self.names())}")
        return _Patch(self, changes)

    def names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    # Record each compiled graph into CUDA graphs after a warm-up call and replay them (runtime/cudagraphs.py);
    # `torch.compile(..., mode="reduce-overhead")` turns it on for that model.
    cudagraphs: bool = dataclasses.field(default_factory=lambda: _env_bool("EMBER_CUDAGRAPHS", False))
    # CUDA graphs kept per compiled graph, one per distinct set of sizes, least recently used dropped.
    cudagraph_max_sizes: int = 8

    def validate(self) -> None:
        # settings that name a kernel backend are checked against the registry (device.check_backend_settings)
        if self.wrapper not in ("python", "fx"):
            raise ValueError(f"ember.config.wrapper={self.wrapper!r}: use 'python' or 'fx'")
        if self.gemm_templates not in ("auto", "always", "matvec", "epilogues", "never"):
            raise ValueError(f"ember.config.gemm_templates={self.gemm_templates!r}: use 'auto', 'always', "
                             f"'matvec', 'epilogues' or 'never'")
        if self.decompose_k not in ("auto", "always", "never"):
            raise ValueError(f"ember.config.decompose_k={self.decompose_k!r}: use 'auto', 'always' or 'never'")


# Settings that leave a graph's Wrapper IR as it is: they act before ember receives the graph (the pre-grad
# and joint passes change the graph itself), on how the program is rendered or run, or on ember's own
# bookkeeping. The graph cache's key holds every other setting (runtime/graph_key.py).
NOT_IN_PROGRAM = ("fallback_on_error", "debug", "debug_dir", "debug_sync", "wrapper", "fx_wrapper_class",
                  "compile_workers", "fast_launch", "static_launch", "direct_inference_call", "pre_grad_passes",
                  "joint_passes", "graph_cache", "cache_max_gb", "compile_profile", "quiet", "cudagraphs",
                  "cudagraph_max_sizes", "report_steps", "report_warmup", "fused_linear_cross_entropy",
                  "linear_cross_entropy_chunk_bytes")


class _Patch(contextlib.ContextDecorator):
    def __init__(self, cfg: Config, changes: dict):
        self.cfg, self.changes, self.saved = cfg, changes, []

    def __enter__(self):
        self.saved.append({k: getattr(self.cfg, k) for k in self.changes})
        for k, v in self.changes.items():
            setattr(self.cfg, k, v)
        return self.cfg

    def __exit__(self, *exc):
        for k, v in self.saved.pop().items():
            setattr(self.cfg, k, v)
        return False


config = Config()
