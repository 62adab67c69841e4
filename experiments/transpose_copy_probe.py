"""BERT's attention operands copied for the math-SDPA bmm chain (bf16 [2048, 768] -> float32 heads): the keys
transposed to [batch*heads, dim, seq] and the queries to [batch*heads, seq, dim]; GPU kernel time of ember
with and without 2-D tiles, and of inductor. Needs a CUDA GPU:
    python -m experiments.transpose_copy_probe"""

import torch

import ember  # noqa: F401
from benchmarks.kernels import device_ms
from ember.schedule import tiling


def keys(k):
    return (k.view(4, 512, 12, 64).permute(0, 2, 3, 1).float() * 0.35).reshape(48, 64, 512)


def queries(k):
    return (k.view(4, 512, 12, 64).permute(0, 2, 1, 3).float() * 0.35).reshape(48, 512, 64)


def main():
    k = torch.randn(2048, 768, device="cuda").bfloat16()
    choose = tiling.choose_tiling      # codegen.backends imports it from the module at each kernel
    for name, fn in (("keys", keys), ("queries", queries)):
        res = {}
        for label, rule in (("ember tiled", choose), ("ember flat", lambda group: None)):
            tiling.choose_tiling = rule
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="ember")
            res[label] = 1e3 * device_ms(lambda: compiled(k))
        tiling.choose_tiling = choose
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        res["inductor"] = 1e3 * device_ms(lambda: compiled(k))
        print(f"{name:8}" + "  ".join(f"{a} {b:.2f} us" for a, b in res.items()), flush=True)


if __name__ == "__main__":
    main()
