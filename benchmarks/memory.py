"""Peak memory of one step, eager vs inductor vs ember, in one process (the models of `models.py`).

    python -m benchmarks.memory [--models gpt2] [--modes infer,train] [--device cpu] [--small]

Peak = the most bytes allocated at once during a step, above what was allocated before it (after a first,
compiling step): CUDA's allocator statistics on a GPU, the profiler's record of every CPU allocation on a
CPU (`ember.testing.peak_bytes`). On a CPU, full-size models run in float32 (`--small` for tiny ones).
"""
from __future__ import annotations

import argparse
import copy

import torch

import ember  # noqa: F401  (registers the backend)
from benchmarks import models as M
from ember.testing import peak_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--backends", default="eager,inductor,ember")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    specs = a.backends.split(",")
    print(f"{'model':10}{'mode':7}" + "".join(f"{s:>12}" for s in specs) + "   (peak MiB of one step)")
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            torch.manual_seed(0)
            base, n_out = M.build(name, a.small)
            inp = M.make_inputs(name, mode, a.small, n_out, a.device)
            if a.device != "cuda":          # float32 models on a CPU take float32 images
                inp = {k: v.float() if v.is_floating_point() else v for k, v in inp.items()}
            cells = []
            for spec in specs:
                torch._dynamo.reset()
                model = copy.deepcopy(base).to(a.device)
                if mode == "infer":
                    model = model.eval()
                    if a.device == "cuda":
                        model = model.to(torch.bfloat16)
                f = model if spec == "eager" else torch.compile(model, backend=spec)
                M.run_step(f, inp, mode, a.device)                   # compile outside the measurement
                cells.append(peak_bytes(lambda: M.run_step(f, inp, mode, a.device)) / 2**20)
                del f, model
            print(f"{name:10}{mode:7}" + "".join(f"{c:12.1f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
