"""Convolution layouts (graph/passes/conv_layout.py) measured: a ResNet-like stack compiled by ember with
conv_layout="as_traced" (NCHW) and "channels_last", per step, inference and training, on the CPU or a GPU.
Defines its model inline (no torchvision).

    python -m benchmarks.conv_layout                    # CPU, float32
    python -m benchmarks.conv_layout --device cuda --dtype bfloat16
    python -m benchmarks.conv_layout --gpu-check        # ResNet-50 / ConvNeXt-T (torchvision, timm) on a GPU

--gpu-check profiles a few steps of ResNet-50 and ConvNeXt-T, inference (bf16) and training (bf16 autocast)
as benchmarks/models.py builds them, compiled by ember with each conv_layout, and prints per step: the
time, and the layout-conversion kernels cuDNN runs inside its convolutions (`nchwToNhwc`, `nhwcToNchw`),
which the channels-last plan should leave at zero.
"""
from __future__ import annotations

import argparse
import time

import torch

import ember


class Bottleneck(torch.nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(cin, mid, 1, bias=False), torch.nn.BatchNorm2d(mid)
        self.c2, self.b2 = torch.nn.Conv2d(mid, mid, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(mid)
        self.c3, self.b3 = torch.nn.Conv2d(mid, cout, 1, bias=False), torch.nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + (x if self.down is None else self.down(x)))


def resnet_like(width: int = 64) -> torch.nn.Module:
    """A stem and three stages of bottlenecks (ResNet-50's first three stages, fewer blocks)."""
    layers = [torch.nn.Conv2d(3, width, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
              torch.nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, blocks in enumerate((2, 2, 2)):
        mid = width * 2 ** stage
        for b in range(blocks):
            layers.append(Bottleneck(cin, mid, 4 * mid, 2 if b == 0 and stage > 0 else 1))
            cin = 4 * mid
    return torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, 10))


def step_ms(model, x, train: bool, steps: int) -> float:
    def step():
        if train:
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    for _ in range(2):
        step()
    if x.is_cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


CONVERSIONS = ("nchwToNhwc", "nhwcToNchw")


def gpu_check(models: list, steps: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    from . import models as bench
    print(f"{'model':10s} {'mode':6s} {'conv_layout':14s} {'ms/step':>8s} " +
          " ".join(f"{k + '/step':>15s}" for k in CONVERSIONS) + "  max|ember-eager| (infer)")
    for name in models:
        for mode in ("infer", "train"):
            model, inp = bench.model_and_inputs(name, mode)
            ref = bench.run_step(model, inp, mode, "cuda") if mode == "infer" else None
            for layout in ("as_traced", "auto", "channels_last"):
                with ember.config.patch(conv_layout=layout):
                    step = bench.warm_step(model, inp, mode, "ember")
                    ms = _timed(step, steps)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(steps):
                            out = step()
                        torch.cuda.synchronize()
                counts = {k: sum(e.count for e in prof.key_averages() if k in e.key) / steps for k in CONVERSIONS}
                diff = f"{(out.float() - ref.float()).abs().max().item():.3g}" if ref is not None else "-"
                print(f"{name:10s} {mode:6s} {layout:14s} {ms:8.2f} " +
                      " ".join(f"{counts[k]:15.1f}" for k in CONVERSIONS) + f"  {diff}", flush=True)


def _timed(step, steps: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpu-check", action="store_true")
    p.add_argument("--models", default="resnet50,convnext")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    if a.gpu_check:
        gpu_check(a.models.split(","), a.steps)
        return
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    x = torch.randn(a.batch, 3, a.size, a.size, device=a.device, dtype=dtype)
    print(f"ResNet-like stack, batch {a.batch}, {a.size}x{a.size}, {a.dtype} on {a.device}: ms per step")
    for train in (False, True):
        row = []
        for layout in ("as_traced", "channels_last"):
            model = resnet_like().to(a.device, dtype).train(train)
            torch._dynamo.reset()
            with ember.config.patch(conv_layout=layout):
                compiled = torch.compile(model, backend="ember")
                row.append(step_ms(compiled, x, train, a.steps))
        eager = step_ms(resnet_like().to(a.device, dtype).train(train), x, train, a.steps)
        print(f"  {'training' if train else 'inference':9s}  eager NCHW {eager:8.2f}   ember as_traced {row[0]:8.2f}"
              f"   ember channels_last {row[1]:8.2f}   ({row[0] / row[1]:.2f}x)")


if __name__ == "__main__":
    main()
