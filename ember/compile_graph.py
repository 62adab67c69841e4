"""compile_graph(gm, example_inputs): an ATen FX graph -> a callable. The middle of the pipeline, in order:

    decompose            graph/decompose.py          ATen ops ember does not lower -> simpler ATen ops
    post-grad passes     graph/passes/post_grad.py
    lower                lowering/graph_lowering.py  FX nodes -> loop IR (Pointwise, Reduction, buffers)
    schedule + fuse      schedule/                   buffers -> fused groups in execution order
    generate code        codegen/program.py          groups -> kernels + Wrapper IR
    render + load        codegen/wrapper/            Wrapper IR -> Python `call(args)` (or an FX GraphModule,
                                                     config.wrapper="fx") with kernels loaded

A graph compiled before (in this process or another) skips everything up to rendering: its Wrapper IR
comes from the on-disk graph cache (runtime/graph_cache.py). runtime/compile_profile.py times each stage.
"""
from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from typing import Callable

import torch
import torch.fx

from . import config, metrics, state
from .codegen import planned_peak
from .codegen.program import ProgramBuilder
from .codegen.wrapper.device_guard import guard_current_device
from .codegen.wrapper.fx import compile_fx
from .codegen.wrapper.lines import CallExtern
from .codegen.wrapper.python import compile_python
from .device import check_backend_settings
from .debug.dump import DebugDump
from .debug.irprint import describe_buffers, describe_groups
from .graph import decompose as decomp
from .graph.passes import conv_layout, post_grad
from .ir.symbolic import hint
from .lowering.graph_lowering import GraphLowering
from .runtime import compile_pool, graph_cache, rank_agreement
from .runtime.checks import EmberNanError
from .runtime.compile_profile import CompileProfile
from .runtime.cudagraph_partition import compile_partitioned
from .runtime.cudagraphs import wrap as cudagraph_runner
from .runtime.gc_pause import gc_paused
from .schedule.fusion import Fusion, build_nodes
from .schedule.combine import gather_combinable
from .schedule.overlap import overlap_collectives, static_nbytes
from .lowering.registry import load_all
from .report import collect_graph, recorder as report_recorder

# every lowering registers (and tells graph/decompose.py which ops it lowers) before anything asks for the
# decomposition table: Dynamo's AOTAutograd, the decompose pass and the pattern matcher's tracing
load_all()


class EmberCompileError(RuntimeError):
    pass


class CompiledGraph:
    """Boxed callable: call with a list of inputs (the list is emptied), returns a tuple of outputs."""
    def __init__(self, fn: Callable, source: str, kernel_count: int, gm: torch.fx.GraphModule, kernels: list,
                 calls_aten: bool = True):
        # an instance attribute: wrappers that copy __dict__ (functools.wraps) must see it too
        self._boxed_call = True
        self.fn, self.source, self.kernel_count, self.gm, self.kernels = fn, source, kernel_count, gm, kernels
        self.checked = False       # the first run succeeded (or failed over to eager): call fn as it is
        # the wrapper calls ATen ops (fallbacks, matmuls), which grad mode and autocast act on; a graph of
        # ember's kernels alone runs the same in any mode
        self.calls_aten = calls_aten
        self.output_strides = ()   # where the forward's layouts were planned: its backward reads these
        self.rank_local_fallback = True     # a failed first run may run eagerly on this rank alone
        self.cache_entry = None    # (key, bytes) of this graph's graph-cache entry, where it has one
        self.load_gm = None        # where `gm` is None: a callable that returns it (a graph loaded from a cache)

    def __call__(self, args):
        if self.checked:
            return self.fn(args)
        saved = list(args)
        try:
            out = self.fn(args)
            self.checked = True
            return out
        except Exception as e:
            # a NaN found by config.check_nans is what the user asked to see, and eager computes it too
            # ... and a graph with collectives: the failure is this rank's, and running eagerly here alone
            # could change the sequence of collectives the ranks issue
            if not config.fallback_on_error or isinstance(e, EmberNanError) or not self.rank_local_fallback \
                    or self.gm is None and self.load_gm is None:
                raise
            if self.gm is None:
                self.gm = self.load_gm()
            _warn(f"ember: the compiled graph failed on its first run ({type(e).__name__}: {e}); "
                  f"running it eagerly from now on")
            metrics.eager_fallbacks += 1
            self.fn = _eager(self.gm, self.output_strides)
            self.calls_aten = True
            self.checked = True
            return self.fn(saved)


def _eager(gm: torch.fx.GraphModule, output_strides=()):
    def run(args):
        a = list(args)
        args.clear()
        out = gm(*a)
        if not output_strides:
            return out
        return type(out)(torch.empty_strided(o.shape, st, dtype=o.dtype, device=o.device).copy_(o)
                         if st is not None and isinstance(o, torch.Tensor) else o for o, st in zip(out, output_strides))
    run._boxed_call = True
    return run


def _where(e: BaseException) -> str:
    """' (at ember/x.py:12 in f)' for the innermost ember frame of the error, for bug reports."""
    c = e
    while getattr(c, "cause", None) is not None or c.__cause__ is not None:
        c = getattr(c, "cause", None) or c.__cause__
    frames = [f for f in traceback.extract_tb(c.__traceback__) if f"{os.sep}ember{os.sep}" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    if config.debug:
        return "\n" + "".join(traceback.format_exception(c))
    return f" (at {f.filename.split(os.sep + 'ember' + os.sep, 1)[-1]}:{f.lineno} in {f.name})"


def _warn(msg: str):
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, is_backward: bool = False,
                  is_inference: bool = False, cudagraphs: bool | None = None, static_inputs=None):
    """Compile an ATen-level FX graph (forward, backward or inference). Returns a boxed callable
    (`fn(list_of_inputs) -> tuple`). If compilation fails, warns once and returns the graph itself,
    run eagerly (ember.config.fallback_on_error=False raises instead). `cudagraphs` (default
    ember.config.cudagraphs) records the compiled graph into CUDA graphs (runtime/cudagraphs.py), split
    around what cannot be recorded (runtime/cudagraph_partition.py, which compiles each captured partition
    with its `static_inputs`: the indices of the inputs it reads in place)."""
    kind = "backward" if is_backward else ("inference" if is_inference else "forward")
    # a graph with collectives: the ranks agree on compiling it or running it eagerly (runtime/rank_agreement.py)
    groups = rank_agreement.collective_groups(gm)
    given = rank_agreement.graph_as_given(gm) if groups else gm
    try:
        with gc_paused():
            compiled = _compile(gm, list(example_inputs), kind,
                                config.cudagraphs if cudagraphs is None else cudagraphs, static_inputs)
    except Exception as e:
        if groups:
            rank_agreement.all_succeeded(False, groups)
        return _fail(kind, e, given)
    if groups and not rank_agreement.all_succeeded(True, groups):
        return _fail(kind, EmberCompileError("another rank failed to compile it"), given)
    if groups and isinstance(compiled, CompiledGraph):
        compiled.rank_local_fallback = False
    return compiled


def _fail(kind: str, e: Exception, gm):
    msg = f"ember failed to compile a {kind} graph and will run it eagerly: {type(e).__name__}: {e}{_where(e)}"
    if not config.fallback_on_error:
        raise EmberCompileError(msg) from e
    _warn(msg + "\n  (set ember.config.fallback_on_error = False to raise instead)")
    metrics.eager_fallbacks += 1
    return _eager(gm)


def _compile(gm, example_inputs, kind, cudagraphs: bool, static_inputs=None) -> CompiledGraph:
    config.validate()
    check_backend_settings()
    partitioned = compile_partitioned(gm, example_inputs, kind) if cudagraphs and static_inputs is None else None
    if partitioned is not None:
        return partitioned
    # config.report: what this graph holds and how long its calls take, for the report written at exit
    report = report_recorder().begin_graph(kind) if config.report else None
    with CompileProfile(kind) as profile:
        with profile.stage("cache lookup"):
            # a report reads the pipeline's stages, which a hit skips
            cache, cached = graph_cache.lookup(gm, example_inputs, kind) if report is None else (None, None)
        dump = DebugDump(kind)
        if cached is not None:
            # the CompiledGraph keeps the graph it was given (an eager fallback runs it) and, having generated
            # no kernel, an empty `kernels` (what the debug tools read)
            profile.cache = "hit"
            program, kernel_count, kernels = cached.program, cached.kernel_count, []
        else:
            profile.cache = "miss" if cache is not None else "off"
            gm, program, builder = _generate(gm, example_inputs, kind, dump, profile, report)
            kernel_count, kernels = builder.kernel_count, builder.kernels
            if cache is not None:
                with profile.stage("cache store"):
                    cache.store(program, kernel_count)
        # a training step's graphs' kernels finish compiling in the workers while AOTAutograd goes on (to
        # the backward graph; from it to the forward's first run); their first launches wait for them
        with compile_pool.kernels_waited_for_at_first_launch() if kind in ("forward", "backward") \
                else contextlib.nullcontext():
            compiled = _assemble(program, kernel_count, kernels, gm, kind, profile, dump, report,
                                 cudagraph=(example_inputs, static_inputs) if cudagraphs else None)
    if cache is not None and cache.payload is not None:
        compiled.cache_entry = (cache.key, cache.payload)
    return compiled


def load_compiled(entry: bytes, key: str, load_gm, kind: str) -> CompiledGraph:
    """A compiled graph from a graph-cache entry's bytes (`CompiledGraph.cache_entry` of the graph compiled
    under `key`), rendered and loaded as a hit of the graph cache is (runtime/whole_graph_cache.py).
    `load_gm()` returns the graph, which an eager fallback runs (or None: no fallback). Raises when the
    entry does not load."""
    with CompileProfile(kind) as profile:
        with profile.stage("cache lookup"):
            cached = graph_cache.from_payload(entry, key)
        if cached is None:
            metrics.graph_cache_misses += 1
            raise EmberCompileError("a whole-graph entry's compiled graph does not load")
        metrics.graph_cache_hits += 1
        profile.cache = "hit"
        compiled = _assemble(cached.program, cached.kernel_count, [], None, kind, profile, DebugDump(kind), None)
    compiled.cache_entry, compiled.load_gm = (key, entry), load_gm
    return compiled


def _assemble(program, kernel_count, kernels, gm, kind, profile, dump, report, cudagraph=None) -> CompiledGraph:
    """The compiled graph of a program: its wrapper rendered and its kernels loaded (`cudagraph`: (example
    inputs, static inputs) to record it into CUDA graphs)."""
    profile.kernels = kernel_count
    with profile.stage("render"):
        fn, source = compile_fx(program) if config.wrapper == "fx" else compile_python(program)
    fn = guard_current_device(fn, program)
    if cudagraph is not None:
        fn = cudagraph_runner(fn, gm, cudagraph[0], kind, cudagraph[1])
    dump.write("wrapper.py", source)
    by_extension: dict = {}
    for k in program.kernels():
        by_extension.setdefault(k.backend.file_extension, []).append(k.source)
    for ext, sources in by_extension.items():
        dump.write(f"kernels.{ext}", "\n\n".join(sources))
    metrics.graphs_compiled += 1
    metrics.generated_kernel_count += kernel_count
    seconds = sum(profile.seconds.values())
    dump.write("summary.txt", f"compile seconds: {seconds:.3f}\n"
                              f"kernels: {kernel_count}\nfallbacks: {dict(metrics.fallbacks)}\n")
    if report is not None:
        report.compile_seconds, report.stage_seconds = seconds, dict(profile.seconds)
        fn = report_recorder().observe(report, fn)
    calls_aten = any(isinstance(ln, CallExtern) for ln in program.lines)
    compiled = CompiledGraph(fn, source, kernel_count, gm, kernels, calls_aten)
    if kind == "forward":
        compiled.output_strides = program.output_strides
        conv_layout.report_output_strides(list(program.output_strides))
    return compiled


def _generate(gm, example_inputs, kind, dump, profile, report):
    """The pipeline up to the Wrapper IR: -> (the graph after decomposition and passes, the program, its
    ProgramBuilder)."""
    dump.write("fx_graph.txt", lambda: gm.print_readable(print_output=False))
    with profile.stage("decompose"):
        decomp.pin_factory_devices(gm)
        gm = decomp.decompose(gm, example_inputs)
        _fake_values_in_one_mode(gm, example_inputs)
    gm.meta[post_grad.GRAPH_KIND] = kind
    if kind == "backward":
        conv_layout.adopt_input_strides(gm, example_inputs)
    with profile.stage("post-grad passes"):
        gm = post_grad.run(gm)
    dump.write("post_grad_graph.txt", lambda: gm.print_readable(print_output=False))

    lowering = GraphLowering(gm)
    with state.bind(state.graph, lowering):   # size hints and buffer lookups, for every stage below
        with profile.stage("lowering"):
            lowering.run(*[n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
        dump.write("ir_pre_fusion.txt", lambda: describe_buffers(lowering.buffers))

        with profile.stage("scheduling/fusion"):
            nodes = build_nodes(lowering.buffers)
            seeds = {b.get_name() for b in lowering.buffers if b.elements_vary}
            groups = Fusion(nodes, _nbytes(lowering), seeds).run()
            if config.overlap_collectives:
                groups = overlap_collectives(groups)
            if config.combine_kernels:
                groups = gather_combinable(groups, static_nbytes)
        dump.write("ir_post_fusion.txt", lambda: describe_groups(groups))

        with profile.stage("code generation"):
            builder = ProgramBuilder(lowering, groups, report.prefix if report is not None else None)
            program = builder.build()
            program.output_strides = tuple(conv_layout.planned_output_strides(gm, lowering.outputs))
        dump.write("memory_plan.txt", lambda: planned_peak.summary(program, lowering))
        if report is not None:
            collect_graph(report, gm, lowering, groups, program)
    return gm, program, builder


def _fake_values_in_one_mode(gm, example_inputs) -> None:
    """Give every node a fake value of one FakeTensorMode, where a placeholder has none or the placeholders'
    come from several modes (make_fx in real mode fakes each input in a mode of its own): the passes run
    each op they insert on its inputs' values, which must share a mode."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    modes = {id(v.fake_mode) for v in vals if isinstance(v, FakeTensor)}
    if all(v is not None for v in vals) and len(modes) <= 1:
        return
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch._guards import detect_fake_mode
    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(
        *[mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x
          for x in example_inputs])


def _nbytes(lowering):
    known: dict[str, int] = {}        # fusion scores every candidate pair by these: each is computed once

    def nbytes(name: str) -> int:
        if name not in known:
            try:
                buf = lowering.get_buffer(name)
                known[name] = int(hint(buf.layout.storage_size())) * buf.layout.dtype.itemsize
            except Exception:
                known[name] = 0
        return known[name]
    return nbytes
