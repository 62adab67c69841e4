"""Two torch.profiler Chrome traces side by side: GPU time per kernel name, the largest differences first.

    python -m experiments.trace_kernel_diff A.json B.json [--top 40] [--labels inductor,ember]

Kernel names are normalized: a generated Triton kernel's name loses its numeric suffix and its compiler
prefix (`triton_red_fused_..._12` -> `red_fused_...`), and ember's lose their place in their graph
(`kernel12_mean_mul_rsqrt` -> `kernel:mean_mul_rsqrt`), so that each matches across graphs and runs; library
kernels keep their names (a cuBLAS name carries its tile shape). Each row: A's us and calls, B's us and calls,
B - A. The totals per kind (gemm, attention, nccl, generated, other) come first.
"""
from __future__ import annotations

import argparse
import json
import re

KINDS = (("nccl", ("nccl",)),
         ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce")),
         ("attention", ("flash", "fmha", "attention")),
         ("generated", ("triton", "ember_")))


def kind(name: str) -> str:
    low = name.lower()
    if re.fullmatch(r"kernel\d+(_\w+)?", name):       # ember's generated kernels: kernel3_mean_mul_rsqrt
        return "generated"
    return next((k for k, words in KINDS if any(w in low for w in words)), "other")


def normalized(name: str) -> str:
    name = re.sub(r"^(triton_|ember_)", "", name)
    name = re.sub(r"_\d+$", "", name)
    name = re.sub(r"^kernel\d+(_|$)", "kernel:", name)      # ember's: its place in its graph dropped
    return name[:90]


def kernel_totals(path: str) -> tuple[dict, dict]:
    """-> ({normalized name: [us, calls]}, {kind: us})"""
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    names: dict = {}
    kinds: dict = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel" or "dur" not in e:
            continue
        name, dur = e.get("name", ""), float(e.get("dur", 0.0))
        t = names.setdefault(normalized(name), [0.0, 0])
        t[0] += dur
        t[1] += 1
        k = kind(name)
        kinds[k] = kinds.get(k, 0.0) + dur
    return names, kinds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--labels", default="A,B")
    args = p.parse_args(argv)
    la, lb = args.labels.split(",")
    (na, ka), (nb, kb) = kernel_totals(args.a), kernel_totals(args.b)
    print(f"{'kind':<12}{la + ' us':>14}{lb + ' us':>14}{'diff':>12}")
    for k in sorted(set(ka) | set(kb)):
        a, b = ka.get(k, 0.0), kb.get(k, 0.0)
        print(f"{k:<12}{a:>14.0f}{b:>14.0f}{b - a:>+12.0f}")
    print(f"{'total':<12}{sum(ka.values()):>14.0f}{sum(kb.values()):>14.0f}"
          f"{sum(kb.values()) - sum(ka.values()):>+12.0f}")
    print()
    rows = []
    for name in set(na) | set(nb):
        a, b = na.get(name, [0.0, 0]), nb.get(name, [0.0, 0])
        rows.append((b[0] - a[0], name, a, b))
    rows.sort(key=lambda r: -abs(r[0]))
    print(f"{'diff us':>9} {la + ' us/n':>16} {lb + ' us/n':>16}  kernel")
    for d, name, a, b in rows[:args.top]:
        print(f"{d:>+9.0f} {a[0]:>10.0f}/{a[1]:<5} {b[0]:>10.0f}/{b[1]:<5}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
