"""ResNet-50's 1x1 convolutions in inference (bf16, channels-last, batch 64 by default), each followed by
its BatchNorm (running statistics) and ReLU, on a GPU: eager, ember's default (cuDNN's convolution, then
one ember kernel for the norm and ReLU) and ember with `gemm_templates="always"` (the GEMM template over
the input's pixel rows, the norm and ReLU on its tile), plus what `gemm_templates="epilogues"` chooses.
us per call, median of 20 samples of 10 back-to-back calls; each variant checked against eager.

    python -m experiments.conv1x1_probe [--batch 64] [--shapes C_IN,C_OUT,HW;...]
"""
import argparse

import torch

# (input channels, output channels, height = width) of ResNet-50's distinct 1x1 convolutions (stride 1)
RESNET50_1X1 = [(64, 64, 56), (64, 256, 56), (256, 64, 56), (256, 128, 56), (128, 512, 28), (512, 128, 28),
                (512, 256, 28), (256, 1024, 14), (1024, 256, 14), (1024, 512, 14), (512, 2048, 7),
                (2048, 512, 7)]


def _block(c_in: int, c_out: int):
    conv = torch.nn.Conv2d(c_in, c_out, 1, bias=False)
    norm = torch.nn.BatchNorm2d(c_out)
    norm.running_mean.normal_()
    norm.running_var.uniform_(0.5, 2.0)
    return torch.nn.Sequential(conv, norm, torch.nn.ReLU()).eval()


def _time_us(fn, x) -> float:
    from ember.report.roofline import cuda_seconds
    return cuda_seconds(lambda: fn(x), calls=10) * 1e6


def main() -> None:
    import ember
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shapes", default=None, help="C_IN,C_OUT,HW;... (default: ResNet-50's)")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")] if a.shapes else RESNET50_1X1
    print(f"{'c_in x c_out @ hw':>22} {'eager':>8} {'default':>8} {'always':>8} {'epilogues':>10} (us)")
    for c_in, c_out, hw in shapes:
        torch.manual_seed(0)
        block = _block(c_in, c_out).cuda().to(torch.bfloat16).to(memory_format=torch.channels_last)
        x = torch.randn(a.batch, c_in, hw, hw, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        row = []
        with torch.no_grad():
            ref = block(x)
            row.append(_time_us(block, x))
            for mode in ("matvec", "always", "epilogues"):
                torch._dynamo.reset()
                with ember.config.patch(gemm_templates=mode):
                    fn = torch.compile(block, backend="ember")
                    out = fn(x)
                torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
                row.append(_time_us(fn, x))
        print(f"{f'{c_in} x {c_out} @ {hw}':>22} " + " ".join(f"{t:8.1f}" for t in row[:3]) + f" {row[3]:10.1f}",
              flush=True)


if __name__ == "__main__":
    main()
