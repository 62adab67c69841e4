"""Accuracy of half-precision normalization steps on the CPU: ember and eager against an fp32 reference.

Each case (a bare batch norm, conv-bn-relu, ResNet's bottleneck as tests/test_conv_layout.py builds it, the
same bottleneck without its ReLUs, layer norm, group norm) runs in bf16 or fp16 under eager and under ember,
training or eval, and is compared with the same module in fp32 from the same (rounded) weights, input and
output gradient. Per quantity (output, input gradient, each parameter's gradient) it prints ember's and
eager's error over several seeds as the median and the largest of

- max: the largest absolute difference, over the reference's largest magnitude;
- rms: the root-mean-square difference, over the reference's root-mean-square.

The max of a gradient that flows through a ReLU is decided by the few elements whose pre-activation lies
within a rounding error of zero: a backend that rounds differently passes or blocks a different few, and
each one moves the gradient of its whole receptive field by a full gradient's size. So one seed's max says
little; rms, and the ReLU-free bottleneck, show the rounding itself.

    python -m experiments.norm_precision_probe [--dtype bfloat16|float16] [--eval] [--seeds 8] [--cases a,b]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

import ember  # noqa: F401  (registers the backend)
from ember.testing import precision_runs


class Bottleneck(nn.Module):
    """1x1, strided 3x3, 1x1 convolutions with BatchNorm (and ReLU), a strided 1x1 downsample residual."""

    def __init__(self, relu=True, cin=16, mid=8, cout=32, stride=2):
        super().__init__()
        self.act = torch.relu if relu else (lambda t: t)
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.act(self.b1(self.c1(x)))
        y = self.act(self.b2(self.c2(y)))
        return self.act(self.b3(self.c3(y)) + self.down(x))


def _affine(norm):
    with torch.no_grad():
        norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)
        norm.bias.copy_(torch.randn_like(norm.bias))
    return norm


def _running_stats(norm):
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn_like(norm.running_mean) + 2)
        norm.running_var.copy_(torch.rand_like(norm.running_var) * 8 + 1)
    return _affine(norm)


# name: (module factory, input shape, input scale, input offset)
CASES = {
    "batch_norm": (lambda: _running_stats(nn.BatchNorm2d(16)), (8, 16, 12, 12), 3, 2),
    "batch_norm_offset": (lambda: _running_stats(nn.BatchNorm2d(16)), (8, 16, 12, 12), 0.5, 8),
    "conv_bn_relu": (lambda: nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False),
                                           _running_stats(nn.BatchNorm2d(16)), nn.ReLU()), (8, 8, 12, 12), 3, 2),
    "bottleneck": (lambda: Bottleneck(), (2, 16, 10, 10), 1, 0),
    "bottleneck_no_relu": (lambda: Bottleneck(relu=False), (2, 16, 10, 10), 1, 0),
    "layer_norm": (lambda: _affine(nn.LayerNorm(256)), (64, 256), 3, 2),
    "group_norm": (lambda: _affine(nn.GroupNorm(4, 32)), (8, 32, 10, 10), 3, 2),
}


def errors(name, dtype, train=True):
    """{quantity: {metric: (ember's error, eager's error)}} against the fp32 reference, for one seed."""
    make, shape, scale, offset = CASES[name]
    ref, eager, ours = precision_runs(make(), torch.randn(shape) * scale + offset, dtype, train)

    def metrics(got, want):
        d = got - want
        return {"max": (d.abs().max() / want.abs().max()).item(),
                "rms": (d.pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()}
    return {k: {m: (metrics(ours[k], ref[k])[m], metrics(eager[k], ref[k])[m]) for m in ("max", "rms")}
            for k in ref}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype} {'eval' if args.eval else 'training'}: error over the fp32 reference's size, "
          f"median and largest over {args.seeds} seeds")
    for name in args.cases.split(","):
        runs = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            runs.append(errors(name, dtype, train=not args.eval))
        for k in runs[0]:
            cells = []
            for m in ("max", "rms"):
                ours, eager = ([r[k][m][i] for r in runs] for i in (0, 1))
                cells.append(f"{m} ember {statistics.median(ours):.2e} ({max(ours):.2e}) "
                             f"eager {statistics.median(eager):.2e} ({max(eager):.2e})")
            print(f"{name:19s} {k:16s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
