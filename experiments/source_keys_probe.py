"""Any machine: how long a warm start's first call waits, in its main thread, for the keys of installed
sources that AOTAutograd's cache key reads (inductor's `triton_key` and `torch_key`), with ember's background
hashing from Dynamo's first compile start (runtime/source_keys.py) and without it.

    python -m experiments.source_keys_probe [--runs N]

Compiles a 6-block GPT-style training step (ember's demo block, d=256, C++ backend on the CPU) once in a
fresh process to fill fresh cache directories, then runs N warm processes each way, alternating, and
prints each one's first step and the main thread's time inside the two key functions."""
import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import sys, time, torch
import ember
from torch._inductor import codecache
from ember.runtime import source_keys
waits = {}
for name in ("triton_key", "torch_key"):
    orig = getattr(codecache, name)
    def timed(orig=orig, name=name):
        t = time.perf_counter()
        r = orig()
        waits[name] = waits.get(name, 0.0) + time.perf_counter() - t
        return r
    if hasattr(orig, "prefetch"):
        timed.prefetch = orig.prefetch
    setattr(codecache, name, timed)
if sys.argv[1] == "off":
    source_keys._started.append(None)       # as if started already: nothing is hashed ahead
from ember.demo import Block
torch.manual_seed(0)
model = torch.nn.Sequential(*[Block(d=256, n_head=4, seq=128) for _ in range(6)])
x = torch.randn(4, 128, 256)
f = torch.compile(model, backend="ember")
t0 = time.perf_counter()
f(x).pow(2).mean().backward()
print(f"{sys.argv[1]:3s} first step {time.perf_counter() - t0:.3f} s, main thread in the keys "
      + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(waits.items())))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    env = dict(os.environ, EMBER_CACHE_DIR=tempfile.mkdtemp(prefix="ember_keys_"),
               TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ind_keys_"))
    subprocess.run([sys.executable, "-c", CHILD, "cold"], env=env, check=True, capture_output=True)
    for _ in range(a.runs):
        for mode in ("on", "off"):
            out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, check=True, capture_output=True,
                                 text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
