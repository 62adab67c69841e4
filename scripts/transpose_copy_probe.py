"""BERT's attention operands copied for the math-SDPA bmm chain (bf16 [2048, 768] -> float32 heads): the keys
transposed to [batch*heads, dim, seq] and the queries to [batch*heads, seq, dim]; GPU kernel time of ember
with and without 2-D tiles, and of inductor. Needs a CUDA GPU:
    python scripts/transpose_copy_probe.py"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ember  # noqa: E402,F401
from ember.schedule import tiling  # noqa: E402


def kernel_us(fn, *args):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(20):
            fn(*args)
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in p.key_averages()) / 20


def keys(k):
    return (k.view(4, 512, 12, 64).permute(0, 2, 3, 1).float() * 0.35).reshape(48, 64, 512)


def queries(k):
    return (k.view(4, 512, 12, 64).permute(0, 2, 1, 3).float() * 0.35).reshape(48, 512, 64)


def main():
    k = torch.randn(2048, 768, device="cuda").bfloat16()
    choose = tiling.choose_tiling
    users = [m for m in list(sys.modules.values()) if getattr(m, "choose_tiling", None) is choose]
    for name, fn in (("keys", keys), ("queries", queries)):
        res = {}
        for label, rule in (("ember tiled", choose), ("ember flat", lambda group: None)):
            for m in users:
                m.choose_tiling = rule
            torch._dynamo.reset()
            res[label] = kernel_us(torch.compile(fn, backend="ember"), k)
        for m in users:
            m.choose_tiling = choose
        torch._dynamo.reset()
        res["inductor"] = kernel_us(torch.compile(fn), k)
        print(f"{name:8}" + "  ".join(f"{a} {b:.2f} us" for a, b in res.items()), flush=True)


if __name__ == "__main__":
    main()
