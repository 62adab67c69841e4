"""The `ember` command.

    ember demo [--device cpu|cuda] [--backends eager,inductor,ember] [--train] ...
                                                 eager, inductor and ember side by side on a small GPT (ember/demo.py)
    ember bench [args of benchmarks/kernels.py]  memory-bound kernel benchmark (eager / inductor / ember)
    ember report [-o out.html] (script.py | -m module) [args]
                                                 run a program, profile its compiled steps and write an HTML report
                                                 of its graphs and kernels against the machine's rooflines
    ember cache info | clear                     the on-disk cache: where it is and what it holds, or empty it
"""
from __future__ import annotations

import argparse
import os
import sys

from . import demo


def bench(argv: list[str]) -> int:
    import runpy
    # benchmarks/ is not part of the installed package; it is found next to it in a source checkout
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "kernels.py")
    if not os.path.exists(path):
        print(f"ember bench: {path} not found (it lives in ember's source checkout; install with pip -e)",
              file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [path] + argv
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0


REPORT_HELP = """Runs the program as `python script.py args` (or `python -m module args`) would, with every graph
ember compiles recorded and a few steps of them profiled, and writes one self-contained HTML page: the
compiled graphs and Dynamo's graph breaks, each fusion group with its FX nodes and your source lines, and
each kernel and extern call with its bytes, FLOPs and measured time against the machine's memory and FLOP/s
rooflines. A step runs from one call of the first compiled graph to its next. EMBER_REPORT=out.html
python script.py does the same."""


def report(argv: list[str]) -> int:
    import runpy
    from .config import config
    from .report import recorder
    ap = argparse.ArgumentParser(prog="ember report", description=REPORT_HELP,
                                 usage="ember report [-o OUT] [--steps N] [--warmup N] (script.py | -m module) [args ...]")
    ap.add_argument("-o", "--out", default="ember_report.html", help="the page to write (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=config.report_steps, help="steps to profile (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=config.report_warmup,
                    help="steps to run before profiling (default: %(default)s)")
    ap.add_argument("-m", dest="module", help="run a module as `python -m` does")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="the script and its arguments")
    args = ap.parse_args(argv)
    if not args.module and not args.program:
        ap.error("name a script or a module (-m)")
    config.report, config.report_steps, config.report_warmup = os.path.abspath(args.out), args.steps, args.warmup
    report_recorder = recorder()
    saved_argv, saved_path, code = sys.argv, list(sys.path), 0
    try:
        if args.module:
            sys.argv = [args.module] + args.program
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args.program)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.program[0])))
            runpy.run_path(args.program[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        report_recorder.finish()
    return code
def cache(action: str) -> int:
    from .config import config
    from .runtime import cache_dir
    root = cache_dir.cache_root()
    if action == "clear":
        removed = cache_dir.clear(root)
        print(f"ember cache: removed {removed / 1e6:.1f} MB from {root}")
        return 0
    folders = cache_dir.usage(root)
    total = sum(b for _, b in folders.values())
    graphs = folders.get(cache_dir.GRAPHS, (0, 0))[0]
    whole = folders.get(cache_dir.WHOLE, (0, 0))[0]
    private = "private" if cache_dir.is_private(root) else "NOT private: compiled graphs are not cached here"
    print(f"ember cache: {root} ({private})")
    print(f"  {graphs} compiled graph{'' if graphs == 1 else 's'}, {whole} with AOTAutograd's trace "
          f"(whole Dynamo graphs); {total / 1e6:.1f} MB of "
          f"{config.cache_max_gb:g} GB (ember.config.cache_max_gb); graph cache "
          f"{'on' if config.graph_cache else 'off'} (ember.config.graph_cache)")
    for name, (n, b) in sorted(folders.items()):
        print(f"  {name:<10}{n:>8} files{b / 1e6:>10.1f} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="ember", description="ember, a graph compiler for PyTorch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="eager, inductor and ember side by side on a small GPT: compile time, step time, "
                       "memory, kernels, and a check against eager", description=demo.__doc__,
                       epilog=demo.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    d.add_argument("--backends", default=",".join(demo.BACKENDS),
                   help="comma-separated torch.compile backends to compare, eager and ember included "
                        "(default: %(default)s; leave inductor out to skip its compile)")
    d.add_argument("--train", action="store_true", help="time a training step (forward, loss, backward) and check "
                   "the gradients, instead of an inference call")
    d.add_argument("--steps", type=int, default=None,
                   help="timed steps per backend (default 10 on CPU, 20 on CUDA, 3 in the Triton interpreter)")
    d.add_argument("--size", choices=sorted(demo.SIZES), default=None,
                   help="model size (default: the device's; tiny in the Triton interpreter)")
    d.add_argument("--use-caches", action="store_true", help="keep the on-disk kernel caches (a repeated run "
                   "then shows cache hits); by default every first call compiles into a fresh cache")
    d.add_argument("--show-kernel", action="store_true", help="print the largest kernel ember generated")
    c = sub.add_parser("cache", help="the on-disk cache of compiled graphs, kernels and autotuning choices: "
                       "`info` says where it is and what it holds, `clear` empties it")
    c.add_argument("action", choices=["info", "clear"])
    sub.add_parser("bench", help="memory-bound kernel benchmark; arguments go to benchmarks/kernels.py",
                   add_help=False)
    sub.add_parser("report", help="run a program and write an HTML report of its compiled graphs and kernels "
                   "against the machine's rooflines (ember report --help)", add_help=False)
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    if argv[:1] == ["report"]:
        return report(argv[1:])
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        return demo.run(device=args.device, backends=tuple(args.backends.split(",")), steps=args.steps,
                        train=args.train, size=args.size, use_caches=args.use_caches, show_kernel=args.show_kernel)
    if args.cmd == "cache":
        return cache(args.action)
    return 2


if __name__ == "__main__":
    sys.exit(main())
