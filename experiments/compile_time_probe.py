"""ember's own cold-compile time on HF BERT-base, GPT-2 and Llama (or ResNet-50) training steps, per stage (on
the CPU):
    python -m experiments.compile_time_probe [--models bert,gpt2] [--backend triton|cpp] [--repeat N]
        [--clock cpu|wall] [--profile N] [--dump DIR] [--json NEW.json] [--before OLD.json]

Each model (random weights, input randint(0, 30000, (2, 128)); llama: the anchor's llama_small; ResNet-50:
randn(4, 3, 224, 224)) is compiled with `torch.compile(model, backend="ember")` and run for one training step
(forward, then `.float().pow(2).mean().backward()`), in a fresh EMBER_CACHE_DIR so that no graph, kernel or
tuning choice is warm. For each graph ember compiles (forward, backward) the probe prints the stages of
runtime/compile_profile.py and "ember python": the graph's compile time less its "kernel compile/load"
stage. That stage is where kernels are built and loaded: with `--backend cpp` it waits for the C++
compiler, with `--backend triton` (the default: kernels rendered as on a GPU, run by Triton's interpreter)
it only loads the rendered modules. So "ember python" is ember's own Python work per graph: decomposition,
passes, lowering, scheduling, code generation, rendering, hashing; its row "of which garbage collection"
is the time Python's cyclic collector ran inside it. Per model the probe adds ember's passes before
AOTAutograd's partition (pre-grad on Dynamo's graph, joint on the joint graph).

Seconds are this process's CPU time by default (`--clock cpu`: steadier than wall time on a shared
machine; `--clock wall` for wall time). `--repeat N` runs N fresh processes and keeps each stage's least
seconds. Under `--backend triton` the compiled graphs run eagerly by default (`--run eager`: the ATen graph
ember compiled, with the output strides it planned), since Triton's interpreter takes minutes for one step;
what is timed is the compile, which is the same either way.

`--profile N` runs cProfile over ember's compile of each graph (`compile_graph`: Dynamo and AOTAutograd
excluded) and prints the top N functions by cumulative and by own time; under `--backend cpp` the C++
compiler's wall time appears there as the subprocess wait inside "kernel compile/load", so profile with
the Triton backend to see ember's Python alone. `--dump DIR` writes each graph's rendered wrapper and
kernel sources to DIR/<model>/<n>.py (n counts the model's graphs), to diff the generated code before and
after a change. `--json` saves the per-stage seconds; `--before` prints them next to a saved run, with the
speed-up.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import tempfile
import time


def _configure_env(backend: str) -> str:
    cache = tempfile.mkdtemp(prefix="ember_compile_probe_")
    os.environ["EMBER_CACHE_DIR"] = cache
    os.environ["EMBER_CPU_BACKEND"] = backend
    os.environ.setdefault("EMBER_QUIET", "1")
    return cache


def _resnet50():
    """torchvision's ResNet-50 layout (bottlenecks of 3, 4, 6, 3 blocks, BatchNorm, stride on the 3x3
    convolution), written out here so that the probe needs no torchvision."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1):
        return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(), *conv_bn(width, width, 3, stride),
                                      nn.ReLU(), *conv_bn(width, width * 4, 1))
            self.skip = nn.Sequential(*conv_bn(cin, width * 4, 1, stride)) \
                if stride != 1 or cin != width * 4 else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


def _build(model_name: str):
    import torch
    torch.manual_seed(0)
    if model_name == "resnet50":
        return _resnet50().train(), torch.randn(4, 3, 224, 224)
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if model_name == "bert":
        model = BertModel(BertConfig())
    elif model_name == "gpt2":
        model = GPT2LMHeadModel(GPT2Config())
    elif model_name == "llama":          # the anchor's llama_small
        model = LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                             num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                             max_position_embeddings=2048))
    else:
        raise SystemExit(f"unknown model {model_name!r} (bert, gpt2, llama, resnet50)")
    return model.train(), torch.randint(0, 30000, (2, 128))


def _output_tensor(out):
    import torch
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    return out[0]


class Recorder:
    """Per graph: kind, stage seconds, total; optionally a cProfile of each compile and the generated code."""

    def __init__(self, profile: bool, dump_dir: str | None, run_eagerly: bool):
        self.graphs: list[dict] = []
        self.passes: dict = collections.defaultdict(lambda: collections.defaultdict(float))
        self.run_eagerly = run_eagerly
        self.compiling = False              # inside ember's compile of a graph
        self.gc_seconds = 0.0               # Python's cyclic garbage collector, inside the graph's compile
        self.profile = cProfile.Profile() if profile else None
        self.dump_dir = dump_dir
        self.model = ""

    def install(self, clock):
        import importlib
        import types
        from ember.graph.passes import joint, pre_grad
        from ember.runtime import compile_profile
        cg = importlib.import_module("ember.compile_graph")     # the module, not the function ember exports
        recorder = self
        # the stage table's clock: CPU time of this process (steady on a loaded machine) or wall time
        compile_profile.time = types.SimpleNamespace(perf_counter=clock)

        gc_start = [0.0]

        def gc_timer(phase, info):
            if phase == "start":
                gc_start[0] = clock()
            elif recorder.compiling:
                recorder.gc_seconds += clock() - gc_start[0]
        gc.callbacks.append(gc_timer)

        for module, what in ((pre_grad, "pre-grad passes"), (joint, "joint passes")):
            run = module.run

            def timed(gm, *a, _run=run, _what=what, **kw):
                t0 = clock()
                try:
                    return _run(gm, *a, **kw)
                finally:
                    recorder.passes[recorder.model][_what] += clock() - t0
            module.run = timed

        exit_ = compile_profile.CompileProfile.__exit__

        def record_exit(profile, exc_type, *rest):
            total = clock() - profile._start
            recorder.graphs.append({"model": recorder.model, "kind": profile.kind, "total": total,
                                    "kernels": profile.kernels, "stages": dict(profile.seconds),
                                    "gc": recorder.gc_seconds})
            recorder.gc_seconds = 0.0
            return exit_(profile, exc_type, *rest)
        compile_profile.CompileProfile.__exit__ = record_exit

        compile_ = cg._compile

        def profiled_compile(*args, **kwargs):
            if recorder.profile is not None:
                recorder.profile.enable()
            recorder.compiling = True
            try:
                compiled = compile_(*args, **kwargs)
            finally:
                recorder.compiling = False
                if recorder.profile is not None:
                    recorder.profile.disable()
            if recorder.run_eagerly and isinstance(compiled, cg.CompiledGraph):
                # the graph ember compiled (decomposed, after its passes) runs as ATen ops, with the
                # output strides ember planned: what ember's fallback runs
                compiled.fn, compiled.checked = cg._eager(compiled.gm, compiled.output_strides), True
            return compiled
        cg._compile = profiled_compile

        if self.dump_dir:
            for name in ("compile_python", "compile_fx"):
                render = getattr(cg, name)

                def dumping(program, *a, _render=render, **kw):
                    fn, source = _render(program, *a, **kw)
                    recorder.dump(program, source)
                    return fn, source
                setattr(cg, name, dumping)

    def dump(self, program, source: str):
        folder = os.path.join(self.dump_dir, self.model)
        os.makedirs(folder, exist_ok=True)
        n = sum(1 for g in self.graphs if g["model"] == self.model)
        kernels = "\n\n".join(f"# kernel {k.name}\n{k.source}" for k in program.kernels())
        with open(os.path.join(folder, f"{n}.py"), "w") as f:
            f.write(source + "\n\n# ---- kernels ----\n" + kernels)


def _python_seconds(g: dict) -> float:
    return g["total"] - g["stages"].get("kernel compile/load", 0.0)


def _model_seconds(run: dict, model: str) -> float:
    """ember's Python seconds for one model: its graphs' compiles and the passes before AOTAutograd's
    partition (pre-grad on Dynamo's graph, joint on the joint graph)."""
    return sum(_python_seconds(g) for g in run["graphs"] if g["model"] == model) + \
        sum(run["passes"].get(model, {}).values())


def _table(run: dict, before: dict | None) -> str:
    from ember.runtime.compile_profile import STAGES
    graphs = run["graphs"]
    names = [s for s in STAGES if any(s in g["stages"] for g in graphs)]
    names += sorted({s for g in graphs for s in g["stages"]} - set(names))
    lines = [f"seconds of {run['clock']} time; ember python: a graph's compile less its kernel compile/load"]
    old_graphs = before["graphs"] if before is not None else []
    for i, g in enumerate(graphs):
        old = old_graphs[i] if i < len(old_graphs) else None
        head = f"{g['model']} {g['kind']} ({g['kernels']} kernels)"
        lines.append(f"{head:<31}{'now':>9}" + ("" if old is None else f"{'before':>12}{'speed-up':>10}"))
        rows = [(s, g["stages"].get(s), old["stages"].get(s) if old else None) for s in names]
        other = g["total"] - sum(g["stages"].values())
        old_other = old["total"] - sum(old["stages"].values()) if old else None
        rows += [("other", other, old_other), ("total", g["total"], old and old["total"]),
                 ("ember python", _python_seconds(g), old and _python_seconds(old)),
                 ("  of which garbage collection", g.get("gc", 0.0), old and old.get("gc", 0.0))]
        lines += _rows(rows)
    for model in dict.fromkeys(g["model"] for g in graphs):
        passes = run["passes"].get(model, {})
        old_passes = before["passes"].get(model, {}) if before is not None else {}
        head = f"{model} before the partition"
        lines.append(f"{head:<31}{'now':>9}" + ("" if before is None else f"{'before':>12}{'speed-up':>10}"))
        lines += _rows([(what, s, old_passes.get(what)) for what, s in passes.items()])
        old = _model_seconds(before, model) if before is not None else None
        lines.append(f"{model}: ember python {_model_seconds(run, model):.3f} s (graphs and passes)" +
                     ("" if not old else f", before {old:.3f} s, {old / max(_model_seconds(run, model), 1e-9):.2f}x"))
    return "\n".join(lines)


def _rows(rows) -> list:
    out = []
    for name, s, o in rows:
        if s is None:
            continue
        cell = f"  {name:<29}{s:9.3f}"
        if o is not None:
            cell += f"{o:12.3f}" + (f"{o / s:9.2f}x" if s > 1e-6 else f"{'-':>10}")
        out.append(cell)
    return out


def _best(runs: list[dict]) -> dict:
    """Per graph and stage, the least seconds over repeated runs (what a run on an idle machine gives)."""
    best = json.loads(json.dumps(runs[0]))
    for run in runs[1:]:
        for b, g in zip(best["graphs"], run["graphs"]):
            b["total"] = min(b["total"], g["total"])
            b["gc"] = min(b["gc"], g["gc"])
            for name, sec in g["stages"].items():
                b["stages"][name] = min(b["stages"].get(name, sec), sec)
        for model, passes in run["passes"].items():
            for what, sec in passes.items():
                best["passes"][model][what] = min(best["passes"][model][what], sec)
    return best


def _profile_text(profile: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.strip_dirs()
    for key in ("cumulative", "tottime"):
        out.write(f"\n==== top {top} by {key} ====\n")
        stats.sort_stats(key).print_stats(top)
    return out.getvalue()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert,gpt2")
    ap.add_argument("--backend", default="triton", choices=("triton", "cpp"))
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"),
                    help="time stages by this process's CPU time (default) or by wall-clock time")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run N fresh processes and report each stage's least seconds")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N (0: off)")
    ap.add_argument("--profile-file", default=None, help="also save the raw cProfile stats here (pstats)")
    ap.add_argument("--dump", default=None, metavar="DIR")
    ap.add_argument("--run", default=None, choices=("ember", "eager"),
                    help="run the compiled graphs with ember's kernels, or eagerly (the default under "
                         "--backend triton, whose interpreter takes minutes per step)")
    ap.add_argument("--json", default=None, help="write the per-graph stage seconds here")
    ap.add_argument("--before", default=None, help="a --json file of an earlier run to compare with")
    args = ap.parse_args(argv)
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    if args.repeat > 1:
        run = _repeated(args)
    else:
        run = _run_once(args)
    print(_table(run, before))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=1)


def _repeated(args) -> dict:
    import subprocess
    runs = []
    for i in range(args.repeat):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, "-m", "experiments.compile_time_probe", "--models", args.models, "--backend",
                   args.backend, "--clock", args.clock, "--json", out.name]
            if args.run:
                cmd += ["--run", args.run]
            if args.dump and i == 0:
                cmd += ["--dump", args.dump]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(out.name) as f:
                runs.append(json.load(f))
    return _best(runs)


def _run_once(args) -> dict:
    cache = _configure_env(args.backend)
    import torch
    import ember  # noqa: F401  (registers the backend)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    run_eagerly = args.run == "eager" or (args.run is None and args.backend == "triton")
    recorder = Recorder(bool(args.profile), args.dump, run_eagerly)
    recorder.install(time.process_time if args.clock == "cpu" else time.perf_counter)
    print(f"backend {args.backend}, cache {cache}, torch {torch.__version__}", file=sys.stderr)
    for name in args.models.split(","):
        torch._dynamo.reset()
        recorder.model = name
        model, ids = _build(name)
        compiled = torch.compile(model, backend="ember")
        t0 = time.perf_counter()
        _output_tensor(compiled(ids)).float().pow(2).mean().backward()
        first_call = time.perf_counter() - t0
        print(f"{name}: first training call {first_call:.2f} s wall (Dynamo, AOTAutograd, ember, kernel builds, "
              f"run {'eagerly' if run_eagerly else 'with ember kernels'})", file=sys.stderr)
    if recorder.profile is not None:
        print(_profile_text(recorder.profile, args.profile))
        if args.profile_file:
            recorder.profile.dump_stats(args.profile_file)
    return {"backend": args.backend, "clock": args.clock, "graphs": recorder.graphs,
            "passes": {m: dict(p) for m, p in recorder.passes.items()}}


if __name__ == "__main__":
    main()
