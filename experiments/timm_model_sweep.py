"""timm image models at a small input size, compiled with ember against eager on the CPU: inference output,
and one training step's loss, parameter gradients and BatchNorm running statistics (float32), with ember's
counters of what ran eagerly.

    python -m experiments.timm_model_sweep [--models resnet18,vit_tiny_patch16_224] [--modes infer,train]
                                           [--size 64] [--dynamic] [--float64]

Each model is timm's architecture with random weights (seed 0; zero-initialized ones drawn too), drop
rates 0, 10 classes, batch 2 of --size x --size images (models whose input size is part of the
architecture are built for it). One line per model and mode: max |ember - eager| of the logits (and of
the largest logit), or of the loss, the gradients relative to the largest and the running statistics
relative to their largest; eager fallbacks (whole graphs run eagerly), ATen fallbacks (ops ember did not
lower), Dynamo graphs. --dynamic compiles with `dynamic=True` and calls the model with batch sizes 3 and 5
too. timm imports torchvision, which the CPU box lacks: a stand-in package is installed when the import
fails (scripts/count_compiles.py).

A training difference well above float32's rounding is not by itself a wrong gradient: BatchNorm over the
few elements of a late stage's feature maps makes some gradients ill-conditioned, and a pre-activation
within rounding of ReLU's threshold can fall on either side (its whole gradient then appears or vanishes:
dla34's level3 has one at 2.5e-6, whose gradient of 0.022 came and went with the thread count of one
convolution). --float64 runs both sides in float64: a difference that is rounding falls to ~1e-13 there
(dla34, hrnet_w18_small and mobilenetv2_050 do), one that is a wrong formula stays.
"""
from __future__ import annotations

import argparse
import copy

import torch

import ember
from experiments.hf_model_sweep import report_each

# one or two of each family: residual and dense convolutions, depthwise / inverted residual blocks with
# squeeze-excite and hard activations, grouped convolutions, ConvNeXt, vision transformers, windowed and
# pooled attention, MLP-Mixer, hybrid convolution-attention
MODELS = ["resnet18", "resnet50d", "resnext26ts", "densenet121", "efficientnet_b0", "mobilenetv3_small_100",
          "mobilenetv2_050", "regnetx_002", "ghostnet_100", "rexnet_100", "dla34", "convnext_atto",
          "edgenext_xx_small", "vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224",
          "swin_tiny_patch4_window7_224",
          "mixer_s16_224", "poolformer_s12", "mobilevit_xxs", "levit_128s", "coat_lite_tiny", "cait_xxs24_224",
          "inception_v3", "tf_efficientnetv2_b0", "repvgg_a0", "hrnet_w18_small"]
# models whose input size is fixed by their construction: built for the sweep's size
SIZED = ("vit_", "deit_", "swin_", "mixer_", "levit_", "cait_", "coat_")
# the smallest images a model's unpadded convolutions take
MIN_SIZE = {"inception_v3": 96}


def build(name: str, size: int):
    import timm
    kw = dict(pretrained=False, num_classes=10, drop_rate=0.0, drop_path_rate=0.0)
    if name.startswith(SIZED):
        kw["img_size"] = size
    if name.startswith("swin_"):
        kw["window_size"] = size // 32      # the last stage's feature map is one window
    torch.manual_seed(0)
    try:
        model = timm.create_model(name, **kw)
    except TypeError:           # an architecture without stochastic depth takes no drop_path_rate
        kw.pop("drop_path_rate")
        torch.manual_seed(0)
        model = timm.create_model(name, **kw)
    with torch.no_grad():       # zero-initialized layers (classifier heads) would make the outputs all zero
        for p in model.parameters():
            if p.numel() and not p.any():
                p.normal_(0.0, 0.02)
    return model


def images(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))


def _first(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def run(name: str, mode: str, size: int, dynamic: bool = False, dtype=torch.float32) -> str:
    size = max(size, MIN_SIZE.get(name, 0))
    model = build(name, size).to(dtype)
    model.train(mode == "train")
    ours = copy.deepcopy(model)
    ember.metrics.reset()
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="ember", dynamic=True if dynamic else None)
    worst = [0.0, 0.0, 0.0, 0]
    for batch in [2] + ([3, 5] if dynamic else []):
        x = images(batch, size).to(dtype)
        worst = [max(w, d) for w, d in zip(worst, _compare(model, ours, compiled, x, mode))]
    if mode == "infer":
        detail = f"out max|diff| {worst[0]:.2e} (of {worst[1]:.2e})"
    else:
        detail = f"loss |diff| {worst[0]:.2e}, grad max|diff|/max {worst[1]:.2e}, " \
                 f"running stats {worst[2]:.2e}" + (f", {worst[3]} grads missing" if worst[3] else "")
    m = ember.metrics
    return f"{detail}; eager fallbacks {m.eager_fallbacks}, aten fallbacks {dict(m.fallbacks)}, " \
           f"graphs {m.graphs_compiled}"


def _compare(model, ours, compiled, x, mode: str) -> tuple:
    """One call of eager and of the compiled copy: inference (max |diff|, max |eager|, 0, 0); training (loss
    |diff|, gradients' max |diff| relative to the largest gradient, buffers' (running statistics') max |diff|
    relative to their largest, gradients present on one side only)."""
    if mode == "infer":
        with torch.no_grad():
            e, c = _first(model(x)), _first(compiled(x))
        return (e - c).abs().max().item(), e.abs().max().item(), 0.0, 0
    model.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    target = torch.arange(x.shape[0]) % 10
    le = torch.nn.functional.cross_entropy(_first(model(x)), target)
    lc = torch.nn.functional.cross_entropy(_first(compiled(x)), target)
    le.backward()
    lc.backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), ours.parameters())]
    gmax = max(a.abs().max().item() for a, _ in grads if a is not None)
    gdiff = max((a - b).abs().max().item() for a, b in grads if a is not None and b is not None)
    missing = sum((a is None) != (b is None) for a, b in grads)
    stats = [(a, b) for a, b in zip(model.buffers(), ours.buffers()) if a.is_floating_point()]
    smax = max((a.abs().max().item() for a, _ in stats), default=0.0) or 1.0
    sdiff = max(((a - b).abs().max().item() for a, b in stats), default=0.0)
    return abs(le.item() - lc.item()), gdiff / gmax, sdiff / smax, missing


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--dynamic", action="store_true")
    p.add_argument("--float64", action="store_true", help="models and images in float64")
    a = p.parse_args(argv)
    dtype = torch.float64 if a.float64 else torch.float32
    try:
        import torchvision  # noqa: F401
    except ImportError:
        from scripts.count_compiles import stub_torchvision
        stub_torchvision()
    report_each(a.models.split(","), a.modes.split(","),
                lambda name, mode: run(name, mode, a.size, a.dynamic, dtype),
                width=32)

if __name__ == "__main__":
    main()
