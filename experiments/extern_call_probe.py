"""Host time of calling an ATen op from a generated wrapper, per entry point, on any machine:
    python -m experiments.extern_call_probe
us per call (best of rounds, tiny CPU tensors, so the op's own work is small and the same for each entry):
the OpOverload's boxed C entry (`op._op`, which converts every argument by the schema), the OpOverload
itself (one Python frame more) and torch's own binding (`torch.convolution`, `torch.mm`: the argument
parser's C++ path), for a convolution (nine arguments, four int lists) and a matmul (two tensors)."""
import time

import torch

aten = torch.ops.aten


def us(f, calls=20000, rounds=3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    x, w, a = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 1, 1), torch.randn(2, 2)
    conv = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    cases = {
        "convolution: op._op": lambda: aten.convolution.default._op(*conv),
        "convolution: op": lambda: aten.convolution.default(*conv),
        "convolution: torch.convolution": lambda: torch.convolution(*conv),
        "mm: op._op": lambda: aten.mm.default._op(a, a),
        "mm: torch.mm": lambda: torch.mm(a, a),
    }
    for name, f in cases.items():
        print(f"{name:34s} {us(f):6.2f} us")


if __name__ == "__main__":
    main()
