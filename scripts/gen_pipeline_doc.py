"""Generate docs/pipeline.md: ember's pipeline stage by stage, shown on one real example whose intermediate
forms are captured by running ember on it (nothing in the doc's code blocks is written by hand).

    python -m scripts.gen_pipeline_doc [--out docs/pipeline.md]

Capture points: a custom torch.compile backend sees Dynamo's graph before ember does; a joint pass (a
user hook ember.config offers) sees AOTAutograd's joint graph; EMBER_DEBUG's dump folder holds the rest;
ProgramBuilder.build is wrapped to keep the Wrapper IR, which the dump does not write.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import linecache
import os
import sys
import tempfile
import textwrap

import torch
import torch.nn.functional as F  # noqa: F401  (the example below uses it)

import ember

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXAMPLE_SRC = '''\
def block(x, w, b, proj):
    h = torch.softmax(F.layer_norm(x, (64,), w, b) * 2, dim=-1)
    return x + h @ proj
'''
EXAMPLE_FILE = "<pipeline example>"
# The doc shows this exact text, so the function is defined from it; linecache lets Dynamo quote its lines.
linecache.cache[EXAMPLE_FILE] = (len(EXAMPLE_SRC), None, EXAMPLE_SRC.splitlines(True), EXAMPLE_FILE)
exec(compile(EXAMPLE_SRC, EXAMPLE_FILE, "exec"))

# Every module the doc describes, in pipeline order. tests/test_docs.py checks that each exists and that
# the doc names it, so renaming a module without regenerating the doc fails a test.
MODULES = [
    "ember/dynamo.py", "ember/graph/passes/pre_grad.py", "ember/graph/passes/joint.py",
    "ember/graph/decompose.py", "ember/compile_graph.py", "ember/graph/passes/post_grad.py",
    "ember/lowering/graph_lowering.py", "ember/lowering/registry.py", "ember/lowering/fallback.py", "ember/ir/nodes.py",
    "ember/ir/ops.py", "ember/ir/deps.py", "ember/schedule/nodes.py", "ember/schedule/fusion.py",
    "ember/schedule/memory.py", "ember/codegen/program.py", "ember/device.py",
    "ember/codegen/triton/backend.py", "ember/schedule/structure.py", "ember/codegen/triton/kernel.py", "ember/codegen/triton/heuristics.py", "ember/codegen/wrapper/lines.py",
    "ember/codegen/wrapper/python.py", "ember/runtime/loader.py", "ember/debug/dump.py",
]


def inputs(requires_grad: bool, device: str):
    torch.manual_seed(0)
    x, w, b, proj = torch.randn(8, 64), torch.randn(64), torch.randn(64), torch.randn(64, 64)
    return [t.to(device).requires_grad_(requires_grad) for t in (x, w, b, proj)]


@dataclasses.dataclass
class Capture:
    dynamo: str = ""
    joint: str = ""
    wrapper_ir: dict = dataclasses.field(default_factory=dict)   # graph kind -> rendered Wrapper IR lines
    groups: dict = dataclasses.field(default_factory=dict)       # graph kind -> [(is_kernel, [(buf, origin)])]
    graphs: dict = dataclasses.field(default_factory=dict)       # dump folder name -> {file: text}
    check: str = ""
    metrics: dict = dataclasses.field(default_factory=dict)


def _wrapper_ir_line(ln) -> str:
    fields = []
    for f in dataclasses.fields(ln):
        v = getattr(ln, f.name)
        if f.name == "source":
            fields.append(f"source=<{len(v.splitlines())} lines>")
        elif isinstance(v, torch._ops.OpOverload):
            fields.append(f"{f.name}={v}")
        else:
            fields.append(f"{f.name}={v!r}")
    return f"{type(ln).__name__}({', '.join(fields)})"


@contextlib.contextmanager
def keep_wrapper_ir(cap: Capture, kind_of):
    from ember.codegen.program import ProgramBuilder
    original = ProgramBuilder.build

    def build(self):
        program = original(self)
        kind = kind_of()
        cap.wrapper_ir[kind] = "\n".join(_wrapper_ir_line(ln) for ln in program.lines)
        # origin: the FX node being lowered when the buffer was realized (what forced it into memory)
        cap.groups[kind] = [(g.is_kernel(), [(n.name, str(getattr(n.buf, "origin", "?"))) for n in g.nodes])
                            for g in self.groups]
        return program
    ProgramBuilder.build = build
    try:
        yield
    finally:
        ProgramBuilder.build = original


def run_example(requires_grad: bool, device: str = "cpu") -> Capture:
    cap = Capture()
    kinds = iter(["forward", "backward"] if requires_grad else ["inference"])

    def backend(gm, example_inputs):
        cap.dynamo = gm.print_readable(print_output=False)
        return ember.backend(gm, example_inputs)

    def record_joint(gm):
        cap.joint = gm.print_readable(print_output=False)

    torch._dynamo.reset()
    ember.metrics.reset()
    with tempfile.TemporaryDirectory(prefix="ember_doc_") as dbg, \
            ember.config.patch(debug=True, debug_dir=dbg, fallback_on_error=False, joint_passes=[record_joint], wrapper="python", cpu_backend="triton"), \
            keep_wrapper_ir(cap, lambda: next(kinds)):
        args = inputs(requires_grad, device)
        out = torch.compile(block, backend=backend)(*args)
        ref_args = [a.detach().clone().requires_grad_(requires_grad) for a in args]
        ref = block(*ref_args)
        err = (out - ref).abs().max().item()
        cap.check = f"max |ember - eager| = {err:.2g}"
        if requires_grad:
            out.sum().backward()
            ref.sum().backward()
            gerr = max((a.grad - r.grad).abs().max().item() for a, r in zip(args, ref_args))
            cap.check += f"; gradients: max |ember - eager| = {gerr:.2g}"
        for d in sorted(glob.glob(os.path.join(dbg, "graph_*"))):
            files = {}
            for p in sorted(glob.glob(os.path.join(d, "*"))):
                with open(p) as f:
                    files[os.path.basename(p)] = f.read()
            # the dump's counter is process-wide: name graphs by kind only, so the doc is reproducible
            cap.graphs[os.path.basename(d).split("_", 2)[-1]] = files
    cap.metrics = ember.metrics.summary()
    return cap


# -- the document --------------------------------------------------------------------------------------------

def code(text: str, lang: str = "") -> str:
    return f"```{lang}\n{_strip_paths(text).rstrip()}\n```\n"


def _strip_paths(text: str) -> str:
    # source-location comments carry this machine's absolute paths; keep the doc machine-independent
    out = []
    for ln in text.splitlines():
        if "# File: " in ln:
            head, _, rest = ln.partition("# File: ")
            path, sep, tail = rest.partition(":")
            ln = f"{head}# File: {os.path.basename(path)}{sep}{tail}"
        out.append(ln)
    return "\n".join(out)


def details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n</details>\n"


def section(title: str, module: str, receives: str, returns: str, *parts: str) -> str:
    """Prose parts are dedented; code blocks (already rendered) are kept as they are."""
    body = "\n".join(p if p.startswith(("```", "<details")) else textwrap.dedent(p).strip() + "\n" for p in parts)
    return (f"## {title}\n\n| | |\n|---|---|\n| module | {module} |\n| receives | {receives} |\n"
            f"| returns | {returns} |\n\n{body}\n")


def describe_groups(groups) -> str:
    lines = []
    for i, (is_kernel, nodes) in enumerate(groups):
        what = ", ".join(f"`{b}` (realized at `{o}`)" for b, o in nodes)
        lines.append(f"- group {i}, {'one kernel' if is_kernel else 'an ATen call'}: {what}")
    return "\n".join(lines)


def never_allocated(files: dict) -> list[str]:
    import re
    bufs = re.findall(r"^(buf\d+): ComputedBuffer", files["ir_pre_fusion.txt"], re.M)
    return [b for b in bufs if not re.search(rf"\b{b} = ", files["wrapper.py"])]


def fallbacks_sentence(metrics: dict) -> str:
    fb = metrics.get("fallbacks") or {}
    if not fb:
        return "Every op of this example has a lowering, so no ATen fallback is used."
    ops = ", ".join(f"`{k}`" for k in sorted(fb))
    return (f"In this example {ops} {'has' if len(fb) == 1 else 'have'} no lowering yet, so each call becomes an "
            f"`ExternKernel`: a call to ATen from the wrapper, its inputs realized first.")


def render(inf: Capture, train: Capture, device: str) -> str:
    g = inf.graphs["inference"]
    same_aten = g["fx_graph.txt"] == g["post_grad_graph.txt"]
    local = never_allocated(g)
    persistent = ember.config.persistent_reduction_max
    doc = [f"""\
# ember's pipeline, step by step

<!-- Generated by scripts/gen_pipeline_doc.py from a real run of ember; do not edit by hand.
     Regenerate with: python -m scripts.gen_pipeline_doc -->

This is the path one `torch.compile(fn, backend="ember")` call takes, from the FX graph TorchDynamo
captures to the Triton kernels and the Python wrapper that runs them. Every code block below was captured
by running ember on this example (a layer norm and a softmax, a matmul, a residual add), on {device.upper()} float32
tensors `x: [8, 64]`, `w, b: [64]`, `proj: [64, 64]`, called through `torch.compile(block, backend="ember")`:

{code(EXAMPLE_SRC, "python")}
Result: {inf.check}. To show the Triton kernels, this run uses `cpu_backend="triton"` (Triton's interpreter);
on a GPU Triton compiles the same kernel source, and only the wrapper's `device=` and the launch sizes
change. With the default `cpu_backend="cpp"` the same fused groups become C++/OpenMP functions
(`ember/codegen/cpp/`).

| stage | module | receives | returns |
|---|---|---|---|
| Dynamo hands over a graph | `ember/dynamo.py` (`ember_backend`) | torch-level FX graph + example inputs | a callable for Dynamo |
| pre-grad passes | `ember/graph/passes/pre_grad.py` | torch-level FX graph | the same, rewritten |
| AOTAutograd | `torch._functorch`, set up by `ember/dynamo.py` | torch-level graph | functional ATen graph(s) |
| joint passes + partition | `ember/graph/passes/joint.py`, min-cut partitioner | joint fw+bw ATen graph | forward and backward graphs |
| decompose | `ember/graph/decompose.py` | ATen graph | ATen graph of ops ember lowers |
| post-grad passes | `ember/graph/passes/post_grad.py` | ATen graph | ATen graph |
| lowering | `ember/lowering/graph_lowering.py` + `ember/lowering/*.py` | ATen graph | buffers of loop IR (`ember/ir/nodes.py`) |
| scheduler nodes | `ember/schedule/nodes.py`, `ember/ir/deps.py` | buffers | nodes with reads, writes, deps |
| fusion | `ember/schedule/fusion.py` | nodes | fused groups, in execution order |
| code generation | `ember/codegen/program.py`, `ember/device.py` (`backend_for`), `ember/codegen/triton/backend.py` or `ember/codegen/cpp/backend.py`, `ember/schedule/tiling.py`, `ember/schedule/memory.py` | groups | kernels + Wrapper IR (`ember/codegen/wrapper/lines.py`) |
| render and load | `ember/codegen/wrapper/python.py`, `ember/runtime/loader.py` | Wrapper IR | `call(args)` with kernels bound |

`ember/compile_graph.py` runs the rows from decompose to load in order and reads as their table of
contents; `ember/debug/dump.py` writes each stage's output when `EMBER_DEBUG=1` (the file names below).

"""]
    doc.append(section(
        "1. Dynamo's graph reaches ember", "`ember/dynamo.py` (`ember_backend`)",
        "a `torch.fx.GraphModule` of torch-level calls (`torch.softmax`, `F.layer_norm`, `@`) and example inputs",
        "what AOTAutograd returns: a callable Dynamo installs in place of the traced bytecode",
        """
        TorchDynamo traces the Python bytecode of `block` and hands the backend this graph, still in terms of
        the torch API. Each node keeps its source line in `node.meta["stack_trace"]`; ember quotes it when an
        op cannot be lowered. (Captured with a custom backend that prints the graph, then calls ember.)
        """,
        code(inf.dynamo, "python")))
    doc.append(section(
        "2. Pre-grad passes", "`ember/graph/passes/pre_grad.py`",
        "the torch-level graph", "the same graph, rewritten in place",
        """
        A named list of FX passes, then the user's `ember.config.pre_grad_passes`. At this level the graph
        still has aliasing and in-place ops, so passes here must be conservative; the built-in list is empty
        today. This is the place for rewrites that must see module-level structure before tracing erases it.
        """))
    doc.append(section(
        "3. AOTAutograd: functional ATen, forward and backward",
        "`ember/dynamo.py` sets up `torch._dynamo.backends.common.aot_autograd`; "
        "`ember/graph/decompose.py` supplies the decomposition table; `ember/graph/passes/joint.py`",
        "the torch-level graph", "one ATen graph per `compile_graph` call (inference, or forward and backward)",
        """
        AOTAutograd retraces the graph with fake tensors down to ATen ops and functionalizes it (no aliasing or
        mutation is left, except input mutations, kept as `copy_` at the end), applying ember's decomposition
        table as it traces. `decomposition_table()` starts from PyTorch's core-ATen decompositions, adds the
        composite ops ember wants as reductions plus pointwise ops (softmax, layer norm, batch norm, losses),
        and removes ops ember lowers better itself (`var_mean` by Welford, `gelu`). That is why `F.layer_norm`
        arrives below as `var_mean` plus pointwise ops, and `softmax` as `amax`, `sub`, `exp`, `sum`, `div`.

        With no input requiring a gradient (as here) AOTAutograd produces one inference graph and calls
        `compile_graph(gm, inputs, is_inference=True)`. With gradients it first builds the joint
        forward+backward graph, runs ember's joint passes (`ember/graph/passes/joint.py`, then the user's
        `config.joint_passes`), merges its duplicate nodes (`ember/graph/passes/cse.py`) and partitions it
        with `min_cut_rematerialization_partition`, which picks what
        the forward saves and what the backward recomputes (`ember/graph/passes/partition.py` lets it recompute
        pointwise values the backward's matrix products read); each half then goes to `compile_graph` (see
        [the same example with gradients](#the-same-example-with-gradients)).

        The ATen graph `compile_graph` receives (`fx_graph.txt`):
        """,
        code(g["fx_graph.txt"], "python")))
    pg = ("Here the post-grad graph (`post_grad_graph.txt`) is identical to the graph received: AOTAutograd "
          "already decomposed it, and it has no no-op casts or dead nodes." if same_aten else
          "The post-grad graph (`post_grad_graph.txt`):")
    doc.append(section(
        "4. Decompose and post-grad passes (the start of `compile_graph`)",
        "`ember/compile_graph.py` calls `ember/graph/decompose.py` (`decompose`) and "
        "`ember/graph/passes/post_grad.py` (`run`)",
        "an ATen graph whose nodes carry fake tensors in `meta['val']`", "an ATen graph ember can lower",
        """
        `compile_graph` is also a public entry for ATen graphs that did not come through ember's AOTAutograd
        setup, so it decomposes again: `decompose` re-traces the graph with the same table, under the graph's
        own fake mode, when some node is in the table (and returns it untouched otherwise). The post-grad
        passes then run on the functional graph: drop casts to the dtype a value already has, turn a scatter
        into a constant into a `where`, make softmax's max and sum of exp one `ember::softmax_stats` reduction
        (where the kernel backend reads long rows online: Triton), eliminate dead code, then the user's
        `config.post_grad_passes`.
        """, pg, *([] if same_aten else [code(g["post_grad_graph.txt"], "python")])))
    doc.append(section(
        "5. Lowering: ATen ops to loop IR",
        "`ember/lowering/graph_lowering.py` (`GraphLowering`); one file per op family under `ember/lowering/`, "
        "registered with `@lower(aten.op)` from `ember/lowering/registry.py`; the IR in `ember/ir/nodes.py`, "
        "the ops protocol in `ember/ir/ops.py`; ops with no lowering go to `ember/lowering/fallback.py`",
        "the ATen graph and its input values (fake tensors; sympy symbols for dynamic sizes)",
        "`lowering.buffers` (every realized buffer, in a valid execution order), `graph_inputs`, `outputs`",
        f"""
        `GraphLowering` is an FX interpreter: for each node it calls the op's lowering, with tensors passed as
        `TensorBox`es. A lowering returns a *define-by-run* value: a `Pointwise` is `ranges` plus an
        `inner_fn(index)` that calls `ops.load(name, index)`, `ops.add(a, b)` ...; views only rewrite the index
        function. Nothing is stored until it must be: reductions are realized when built, graph outputs and
        the inputs of extern calls are realized, and a pointwise value with several users is realized only
        when its body is large (`config.inline_max_ops`). Everything else is inlined into its consumers by
        calling its `inner_fn`. {fallbacks_sentence(inf.metrics)}

        The IR before fusion (`ir_pre_fusion.txt`): each realized buffer with its layout, and its body as the
        op calls its `inner_fn` makes, printed by running it under a printing handler
        (`ember/debug/irprint.py`). The layer norm's normalized value is not a buffer: each consumer
        recomputes it from the row statistics.
        """,
        code(g["ir_pre_fusion.txt"])))
    doc.append(section(
        "6. Scheduling and fusion",
        "`ember/schedule/nodes.py` (`SchedulerNode`, `build_nodes` in `ember/schedule/fusion.py`), "
        "`ember/ir/deps.py` (reads and writes), `ember/schedule/fusion.py` (`Fusion`)",
        "`lowering.buffers`", "`FusedGroup`s in a topological order, each one kernel or one extern call",
        """
        `build_nodes` makes one scheduler node per buffer; running each body under a recording handler yields
        its reads and writes as (buffer, index) pairs, from which the dependency edges follow. A node's
        iteration space is `(xnumel, rnumel)`: output elements (or rows) and, for a reduction, the row length.
        `Fusion` merges pairs best-first by estimated bytes saved (`score`: twice the bytes passed from
        producer to consumer, plus the bytes both read) whenever `can_fuse` allows it: same device, iteration
        spaces that fit one kernel (equal, or a pointwise node that splits into the reduction's rows), no
        cycle through a third group, and every shared buffer accessed at the same element by both. It repeats
        to a fixpoint; then launch-bound kernels of equal shape that read one producer's outputs (the second
        steps of split reductions) share a kernel (`fuse_small_siblings`), and the groups are ordered.

        The groups (`ir_post_fusion.txt`):
        """,
        code(g["ir_post_fusion.txt"]),
        "In terms of the ATen graph (each buffer with the FX node whose lowering realized it):\n\n"
        + describe_groups(inf.groups["inference"])))
    doc.append(section(
        "7. Code generation: kernels and Wrapper IR",
        "`ember/codegen/program.py` (`ProgramBuilder`), `ember/device.py` (`backend_for`), "
        "`ember/codegen/triton/backend.py` (`TritonBackend`), `ember/schedule/structure.py` (`group_structure`), "
        "`ember/codegen/triton/kernel.py` (`TritonKernel`), `ember/codegen/triton/heuristics.py`, "
        "`ember/schedule/memory.py`, `ember/codegen/wrapper/lines.py`",
        "the fused groups and the `GraphLowering`", "a `WrapperProgram`: Wrapper IR lines, kernel sources included",
        f"""
        `ProgramBuilder` walks the groups in order. `ember/schedule/memory.py` finds the buffers that live
        only inside one kernel (never allocated; here {", ".join(f"`{b}`" for b in local) or "none"}) and the
        group after which each allocated buffer is dead. For each kernel group `backend_for(device)` picks the
        kernel backend: Triton on CUDA; on CPU the one `config.cpu_backend` names (today Triton, run by its
        interpreter). `TritonKernel` is itself an ops handler: every node's body runs under it with its loop
        variables rewritten to the kernel's flat `xindex` / `rindex`, each op appends a line, common
        subexpressions are shared, and a store followed by a load of the same element is forwarded in
        registers. A reduction whose row has at most `config.persistent_reduction_max` = {persistent} elements is
        *persistent*: the whole row sits in registers, so all the row reductions of a group are one pass over
        memory. `heuristics.py` picks block sizes and warps.

        The kernels (`kernels.py`):
        """,
        code(g["kernels.py"], "python"),
        """
        The Wrapper IR: structured lines, never strings, so the Python renderer and an FX renderer can consume
        one program. (It is not dumped to a file; this was captured by wrapping `ProgramBuilder.build`.)
        """,
        code(inf.wrapper_ir["inference"], "python")))
    doc.append(section(
        "8. Rendering and loading the wrapper",
        "`ember/codegen/wrapper/python.py` (`compile_python`), `ember/runtime/loader.py`; "
        "`CompiledGraph` in `ember/compile_graph.py`",
        "the `WrapperProgram`", "a `CompiledGraph`: a boxed callable `fn(list_of_inputs) -> tuple`",
        """
        `compile_python` renders each line as Python. It writes each backend's kernels as one module into the
        on-disk cache (keyed by a hash of the source, since Triton reads a kernel's source from its file) and
        loads it, then loads the wrapper module with the kernels, ATen ops and constants it names as globals.
        The wrapper takes ownership of its inputs (`args.clear()`), so each `del` frees memory as soon as a
        buffer's last reader has run.

        The wrapper (`wrapper.py`):
        """,
        code(g["wrapper.py"], "python"),
        *([] if not os.path.exists(os.path.join(ROOT, "ember/codegen/wrapper/fx.py")) else ["""
        With `config.wrapper = "fx"` the same Wrapper IR is rendered instead as a `torch.fx.GraphModule`
        (`ember/codegen/wrapper/fx.py`): kernel launches and extern calls become graph nodes, so an
        out-of-tree backend can take over from here.
        """]),
        f"""
        `compile_graph` returns a `CompiledGraph`. Its first call is checked: if it raises, ember warns once
        and runs that graph eagerly from then on (`config.fallback_on_error = False` raises instead); an error
        while compiling is handled the same way. Counters land in `ember.metrics`; for this example
        `{inf.metrics}`.
        """))
    parts = []
    for kind in ("forward", "backward"):
        files = train.graphs.get(kind)
        if not files:
            continue
        parts.append(f"**{kind}**: fused groups\n\n{code(files['ir_post_fusion.txt'])}\n"
                     + describe_groups(train.groups.get(kind, [])) + "\n\n"
                     + details(f"{kind}: the ATen graph compile_graph received", code(files["fx_graph.txt"], "python"))
                     + "\n" + details(f"{kind}: kernels", code(files["kernels.py"], "python"))
                     + "\n" + details(f"{kind}: wrapper", code(files["wrapper.py"], "python")))
    doc.append(f"""\
## The same example with gradients

With `requires_grad=True` on the inputs, AOTAutograd traces forward and backward into one joint graph;
ember's joint passes see it (captured here through `config.joint_passes`), then the min-cut partitioner
splits it. The forward graph returns, after the user's outputs, the tensors the backward needs; the
backward recomputes the rest. Each half goes through `compile_graph` exactly as above.
Result: {train.check}. Metrics: `{train.metrics}`.

{details("the joint forward+backward graph, as the joint passes receive it", code(train.joint, "python"))}
{chr(10).join(parts)}
## Seeing this for your own code

- `EMBER_DEBUG=1 python your_script.py` writes `ember_debug/graph_NNN_<kind>/` per compiled graph, with the
  files quoted above (`fx_graph.txt`, `post_grad_graph.txt`, `ir_pre_fusion.txt`, `ir_post_fusion.txt`,
  `kernels.py`, `wrapper.py`, `summary.txt`); `EMBER_DEBUG_DIR` puts it elsewhere.
- `ember.metrics.summary()` counts graphs, kernels, ATen fallbacks by op, and graphs run eagerly.
- `ember.config.pre_grad_passes`, `joint_passes` and `post_grad_passes` take your own FX passes, run after
  ember's at each of those points.
- Regenerate this page with `python -m scripts.gen_pipeline_doc` after changing a stage.
""")
    return "".join(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "pipeline.md"))
    # the committed doc is made on CPU (any machine can regenerate it identically); cuda is for testing
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args(argv)
    inf = run_example(requires_grad=False, device=a.device)
    train = run_example(requires_grad=True, device=a.device)
    text = render(inf, train, a.device)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(f"wrote {a.out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
