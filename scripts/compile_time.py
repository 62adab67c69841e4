"""Cold compile time of ember on a GPU with and without the compile pool (runtime/compile_pool.py).

    python -m scripts.compile_time [--models gpt2] [--modes train] [--small] [--workers 0,16]

Each cell is a fresh process with empty ember and Triton caches running `benchmarks.models` for one step
(ember only); it prints the first step's seconds (Dynamo + AOTAutograd + ember + every kernel's compile,
and autotuning when on) per worker count. On a CPU (`--models mlp --small`) it times the C++ build instead.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_step(model: str, mode: str, workers: int, small: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(tmp, "ember"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                   EMBER_COMPILE_WORKERS=str(workers))
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "benchmarks.models", "--models", model, "--modes", mode, "--backends", "ember",
               "--iters", "1", "--rounds", "1", "--json", out] + (["--small"] if small else [])
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        return next(r["first_step_s"] for r in json.load(open(out))["cells"] if r["backend"] == "ember")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--modes", default="train")
    ap.add_argument("--workers", default="0,16")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args(argv)
    counts = [int(w) for w in a.workers.split(",")]
    print(f"{'model':8}{'mode':7}" + "".join(f"{f'{w} workers':>12}" for w in counts) + "   (first step, s)")
    for model in a.models.split(","):
        for mode in a.modes.split(","):
            secs = [first_step(model, mode, w, a.small) for w in counts]
            print(f"{model:8}{mode:7}" + "".join(f"{s:12.1f}" for s in secs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
