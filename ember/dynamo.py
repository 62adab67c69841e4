"""The torch.compile entry: Dynamo graph -> pre-grad passes -> AOTAutograd (joint passes, min-cut
partition) -> compile_graph for the forward, backward or inference graph."""
from __future__ import annotations

import contextlib
import functools
import logging
import sys

import torch

from . import config, metrics
from .compile_graph import CompiledGraph, compile_graph
from .device import backend_for, check_backend_settings
from .graph.decompose import LazyTable
from .graph.passes import pre_grad
from .graph.passes.partition import partition
from .graph.passes.linear_cross_entropy import DEFERRED_HEADS, PROGRAM_OUTPUTS
from .runtime import head_logits, whole_graph_cache
from .runtime.compile_start import call_at_compile_end, call_at_compile_start
from .runtime.gc_pause import gc_paused, pause_for_dynamo, resume_after_dynamo

log = logging.getLogger("ember")


class _InferenceCompiler:
    """AOTAutograd's inference compiler: compile_graph, remembering whether AOTAutograd's runtime wrapper
    around the result has anything to do (runtime/direct_call.py)."""

    def __init__(self, n_dynamo_inputs: int, cudagraphs: bool):
        self.n_dynamo_inputs, self.cudagraphs = n_dynamo_inputs, cudagraphs
        self.graph = self.dims = None

    def __call__(self, gm, example_inputs):
        from .runtime.direct_call import dynamic_output_dims, wrapper_is_trivial
        n_placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        compiled = compile_graph(gm, example_inputs, is_inference=True, cudagraphs=self.cudagraphs)
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None)
        if isinstance(compiled, CompiledGraph) and wrapper_is_trivial(meta, n_placeholders, self.n_dynamo_inputs) is None:
            self.graph, self.dims = compiled, dynamic_output_dims(meta)
        return compiled


# torch.compile's modes ember accepts -> (whether the mode records CUDA graphs, whether it times matrix
# products against ember's GEMM templates: gemm_templates="auto"), as inductor's modes do
MODES = {"default": (None, False), "reduce-overhead": (True, False), "max-autotune": (True, True),
         "max-autotune-no-cudagraphs": (None, True)}


def ember_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, **kwargs):
    """`torch.compile(model, backend="ember", mode=...)`."""
    config.validate()
    check_backend_settings()
    if (mode or "default") not in MODES:
        raise ValueError(f"ember: unknown torch.compile mode {mode!r}; use one of {', '.join(MODES)}")
    cudagraphs, tuned_products = MODES[mode or "default"]
    # the search widens the default ("matvec") and "epilogues"; a setting of "always" or "never" stays
    settings = {"gemm_templates": "auto"} if tuned_products and config.gemm_templates in ("matvec", "epilogues") \
        else {}
    _install_compile_callbacks()
    _each_backend(example_inputs, "warm_up")
    with gc_paused(), config.patch(**settings):   # the passes, AOTAutograd's trace and partition, the forward
        return _compile_dynamo_graph(gm, example_inputs, cudagraphs or config.cudagraphs, settings)


def _with_settings(compiler, settings: dict):
    """`compiler` run with the mode's settings: AOTAutograd compiles a backward at its first call, after
    the backend has returned."""
    if not settings:
        return compiler

    def compile_with_settings(*args, **kwargs):
        with config.patch(**settings):
            return compiler(*args, **kwargs)
    return compile_with_settings


def _each_backend(example_inputs, method: str) -> None:
    """`KernelBackend.<method>()` of the backend of each of the inputs' devices: "warm_up" when a graph
    reaches ember, "prepare" when AOTAutograd starts its trace (a miss of its cache)."""
    devices = {x.device for x in example_inputs if isinstance(x, torch.Tensor)}
    for d in sorted(devices, key=str):
        try:
            getattr(backend_for(d), method)()
        except Exception as e:    # noqa: BLE001 - a device without a backend is reported where it compiles
            log.debug("ember: backend %s() for %s: %s", method, d, e)


def _compile_dynamo_graph(gm, example_inputs, cudagraphs: bool, settings: dict):
    gm = pre_grad.run(gm)
    return head_logits.wrap(_compile_passed_graph(gm, example_inputs, cudagraphs, settings),
                            gm.meta.get(DEFERRED_HEADS, []), gm.meta.get(PROGRAM_OUTPUTS))


def _compile_passed_graph(gm, example_inputs, cudagraphs: bool, settings: dict):
    inference = _InferenceCompiler(len(example_inputs), cudagraphs)
    fw_compiler = _with_settings(functools.partial(compile_graph, is_backward=False, cudagraphs=cudagraphs), settings)
    bw_compiler = _with_settings(functools.partial(compile_graph, is_backward=True, cudagraphs=cudagraphs), settings)
    inference_compiler = _with_settings(inference, settings)
    # a warm start loads the whole result from AOTAutograd's cache (runtime/whole_graph_cache.py)
    key_tag = whole_graph_cache.tag(gm, example_inputs, cudagraphs)
    if key_tag is not None:
        fw_compiler = whole_graph_cache.serializable(fw_compiler, "forward")
        bw_compiler = whole_graph_cache.serializable(bw_compiler, "backward")
        inference_compiler = whole_graph_cache.serializable(
            inference_compiler, "inference", lambda compiled: inference.dims if compiled is inference.graph else None)
    compiler = functools.partial(
        _aot_autograd,
        fw_compiler=fw_compiler,
        bw_compiler=_not_traced_backward(bw_compiler),
        inference_compiler=inference_compiler,
        partition_fn=partition,
        decompositions=LazyTable(functools.partial(_each_backend, example_inputs, "prepare")),
        keep_inference_input_mutations=True,
    )
    with whole_graph_cache.lookup_and_store(key_tag) if key_tag is not None else contextlib.nullcontext([]) as loaded:
        compiled = compiler(gm, example_inputs)
    metrics.whole_graph_hits += bool(loaded)
    for code in loaded:             # a hit: the inference graph's direct call, as its compile decided
        if code.kind == "inference" and code.direct_dims is not None:
            inference.graph, inference.dims = code.compiled, code.direct_dims
    if inference.graph is not None and config.direct_inference_call:
        from .runtime.direct_call import direct
        metrics.direct_graphs += 1
        return direct(compiled, inference.graph, inference.dims)
    return compiled


def _aot_autograd(gm, example_inputs, **kwargs):
    """AOTAutograd's trace, partition and compiles of a Dynamo graph, called as torch's `aot_autograd` backend
    helper calls it, without that helper's import of inductor's debug module and scheduler (0.45 s of every
    process on the device hosts, whose torch has no bytecode cache)."""
    from torch._dynamo.utils import counters, flatten_graph_inputs
    from torch._functorch.aot_autograd import aot_module_simplified
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, lambda g, inputs: _aot_autograd(g, inputs, **kwargs))
    # Dynamo's DDP optimizer reads this count to learn that AOTAutograd ran (its first call then returns
    # fake tensors for the next bucket's compile)
    counters["aot_autograd"]["total"] += 1
    compiled = aot_module_simplified(gm, example_inputs, **kwargs)
    counters["aot_autograd"]["ok"] += 1
    return torch._dynamo.disable(compiled, reason="ember's compiled graph is not traced")


def _not_traced_backward(bw_compiler):
    """The backward compiler, and the backward it returns, out of Dynamo's reach: AOTAutograd compiles the
    backward at its first run, inside whatever frame runs it."""
    from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler

    def compile_backward(*args, **kwargs):
        compiled = torch._dynamo.disable(bw_compiler, reason="ember's backward compile is not traced")(*args, **kwargs)
        return torch._dynamo.disable(compiled, reason="ember's compiled backward is not traced")
    if isinstance(bw_compiler, SerializableAOTDispatchCompiler):
        inner = bw_compiler.compiler_fn
        bw_compiler.compiler_fn = _not_traced_backward(inner)
        return bw_compiler
    return compile_backward


def _has_gpu() -> bool:
    return torch.cuda.is_available()


def _compiling_for_ember() -> bool | None:
    """Whether the frame Dynamo starts to compile is compiled for ember: None where that cannot be told.
    Dynamo's start callbacks are not told the backend, but its `_compile` holds it (`compiler_fn`) in a
    frame further up the stack, wrapped by torch.compile's layers, each of which names what it wraps."""
    frame = sys._getframe(1)
    for _ in range(48):
        if frame is None:
            return None
        if frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_code.co_varnames:
            break
        frame = frame.f_back
    else:
        return None
    fn = frame.f_locals.get("compiler_fn")
    for _ in range(8):
        if fn is ember_backend:
            return True
        fn = next((getattr(fn, a) for a in ("_torchdynamo_orig_backend", "compiler_fn", "func", "__wrapped__")
                   if getattr(fn, a, None) is not None), None)
        if fn is None:
            return False
    return None


def _on_dynamo_compile_start(args) -> None:
    """Dynamo starts to compile a frame: pause the garbage collector until its compile ends
    (runtime/gc_pause.py) and, on a machine with a GPU, warm its kernel backend up now (the compile workers'
    zygote then imports while Dynamo traces, seconds before the graph reaches ember), unless the frame is
    compiled for another backend (whose compile ember's zygote would only compete with)."""
    try:
        if _compiling_for_ember() is False:
            return
        pause_for_dynamo()
        if _has_gpu():
            backend_for("cuda").warm_up()
    except Exception as e:    # noqa: BLE001 - the graph's own compile warms its backend up
        log.debug("ember: Dynamo's compile start: %s", e)


def _on_dynamo_compile_end(args) -> None:
    resume_after_dynamo()


def _install_compile_callbacks() -> None:
    call_at_compile_start(_on_dynamo_compile_start)
    call_at_compile_end(_on_dynamo_compile_end)


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
    # once per process; where the package's entry point is listed, torch registers it when it loads it
    if "ember" not in _COMPILER_FNS and _BACKENDS.get("ember") is None:
        register_backend(name="ember")(ember_backend)
    _install_compile_callbacks()
    _warm_up_if_gpu_in_use()


def _warm_up_if_gpu_in_use() -> None:
    """ember is imported when torch.compile looks its backend up. A process that has already put work on
    its GPU will compile for it: its compile workers' zygote starts now, seconds before Dynamo's first
    trace (its imports of torch and Triton took 4.3 s on an H200 host, as long as Dynamo's trace and
    AOTAutograd's before the first kernels are sent). A process without CUDA in use (the command line, a
    CPU program) starts nothing until Dynamo compiles for ember."""
    try:
        if torch.cuda.is_initialized():
            backend_for("cuda").warm_up()
    except Exception as e:    # noqa: BLE001 - the first compile warms the backend up
        log.debug("ember: no warm-up at import: %s", e)
