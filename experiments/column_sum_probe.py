"""Bias-gradient-like column sums (`g.view(4, 512, -1).float().sum([0, 1])`, bf16 gradients): GPU kernel
time of inductor and of ember with the strided split reduction's minimum chunk at 512 and 128 rows, and with
looped instead of persistent column kernels. Needs a CUDA GPU:
    python -m experiments.column_sum_probe"""

import torch

import ember
from benchmarks.kernels import device_ms
import ember.lowering.reductions as R


def bias_grad(g):
    return g.view(4, 512, -1).float().sum([0, 1])


def main():
    default = R.SPLIT_MIN_CHUNK_STRIDED
    for shape in ((2048, 768), (2048, 3072), (8192, 768)):
        g = torch.randn(*shape, device="cuda").bfloat16()
        res = {}
        torch._dynamo.reset()
        compiled = torch.compile(bias_grad)
        res["inductor"] = 1e3 * device_ms(lambda: compiled(g))
        for label, pmax, chunk in (("ember chunk512", None, 512), ("ember chunk128", None, 128),
                                   ("ember looped chunk512", 16, 512), ("ember looped chunk128", 16, 128)):
            R.SPLIT_MIN_CHUNK_STRIDED = chunk
            torch._dynamo.reset()
            with ember.config.patch(**({"persistent_reduction_max": pmax} if pmax else {})):
                f = torch.compile(bias_grad, backend="ember")
                res[label] = 1e3 * device_ms(lambda: f(g))
                torch.testing.assert_close(f(g), bias_grad(g), rtol=1e-3, atol=1e-2)
        R.SPLIT_MIN_CHUNK_STRIDED = default
        print(shape, "  ".join(f"{k} {v:.2f} us" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
