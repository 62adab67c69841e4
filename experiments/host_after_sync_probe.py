"""Why does one compiled call take 25 us of host time after a sync on one anchor case and 60 us on another?
(`experiments/anchor_breakdown.py` on an H100: sum_rows 26.5 us, softmax 63.1, both one kernel.) Needs a
CUDA GPU:
    python -m experiments.host_after_sync_probe PATH/TO/anchor_kernels.py [--cases softmax,sum_rows]

Per case, host us (perf_counter around one call, median) in two situations: right after a sync that waited
for the case's own kernel (the anchor's situation) and right after a sync that waited for `torch.cuda._sleep`
of ~20 us; for: the torch.compile(backend="ember") call, ember's compiled graph called without Dynamo
(`compile_graph` on make_fx's graph), `torch.empty_strided` of the output, Dynamo over a graph returned as is
(the anchor's ceiling stand-in, the case's own function run eagerly inside) and eager. If every row grows
with the wait, the host is slower after a long sync (CPU idle states), not ember's path."""
import argparse
import importlib.util
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from experiments.anchor_breakdown import host_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor")
    ap.add_argument("--cases", default="softmax,sum_rows,add_gelu,cross_entropy")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (no syncs to wait on)")
    ap.add_argument("--iters", type=int, default=60)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("anchor", a.anchor)
    anchor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchor)
    wanted = a.cases.split(",")
    # ~20 us of GPU sleep (cycles at ~1.7 GHz)
    short = (lambda: torch.cuda._sleep(35_000)) if a.device == "cuda" else (lambda: None)  # noqa: E731
    if a.device != "cuda":
        torch.cuda.synchronize = lambda: None
    print(f"{'case':22} {'path':16} {'after own':>10} {'after 20us':>11} {'back2back':>10}   (host us)")
    for name, fn, mkargs, _ in anchor.cases(a.device):
        if not any(w in name for w in wanted):
            continue
        args = mkargs()
        out = fn(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="ember")
        compiled(*args)
        graph = ember.compile_graph(make_fx(fn)(*args), list(args), is_inference=True)
        graph(list(args))
        torch._dynamo.reset()
        standin = torch.compile(fn, backend=lambda gm, ex: gm.forward)
        standin(*args)
        own = lambda: fn(*args)  # noqa: E731  the eager kernel(s): as long a wait as the case's own
        paths = {
            "ember call": lambda: compiled(*args),
            "ember graph": lambda: graph(list(args)),
            "empty_strided": lambda: [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=a.device) for o in outs],
            "dynamo as is": lambda: standin(*args),
            "eager": own,
        }
        for label, f in paths.items():
            f()
            t0 = time.perf_counter()
            for _ in range(20):
                f()
            b2b = (time.perf_counter() - t0) / 20 * 1e6
            print(f"{name:22} {label:16} {host_us(f, own, a.iters):10.1f} {host_us(f, short, a.iters):11.1f} {b2b:10.1f}", flush=True)


if __name__ == "__main__":
    main()
