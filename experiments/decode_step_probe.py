"""anchor_decode.py's decode step per backend, on a GPU: ms per step as the anchor times it, the host's ms per
compiled call (no synchronization), the GPU's kernel ms and kernel count per step, the top kernels, and the
operators with the most self CPU time (torch profiler over 32 steps).
Usage: python -m experiments.decode_step_probe [BACKENDS]   (default inductor@reduce-overhead+clone,
ember@reduce-overhead; a backend as the anchor names it). ANCHOR_DECODE: the path of anchor_decode.py
(default ../shared/bench/anchor_decode.py)."""
import importlib.util
import os
import sys
import time

import torch

_spec = importlib.util.spec_from_file_location(
    "anchor_decode", os.environ.get("ANCHOR_DECODE", os.path.join("..", "shared", "bench", "anchor_decode.py")))
ad = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ad)


def _resolve(spec: str) -> str:
    return "ember:backend" + spec[len("ember"):] if spec.startswith("ember") and not spec.startswith("ember:") else spec


def probe(spec: str, warmup: int = 24, timed: int = 64, profiled: int = 32) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    steps = warmup + timed + 2 * profiled + 8
    model = ad.Decoder(max_len=32 + steps + 16).to("cuda", torch.bfloat16).eval()
    step = ad.compiled(ad.decode_step, _resolve(spec).removesuffix("+clone"))
    if spec.endswith("+clone"):
        step = ad.cloned(step)
    prompt = torch.randint(0, 32000, (1, 32), device="cuda")
    with torch.no_grad():
        tok = model(prompt, torch.arange(32, device="cuda")).argmax(-1)
        p = 32
        for _ in range(warmup):
            tok, _ = step(model, tok, torch.tensor([p], device="cuda")); p += 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(timed):                      # as the anchor: a host-to-device position each step
            tok, _ = step(model, tok, torch.tensor([p], device="cuda")); p += 1
        torch.cuda.synchronize()
        anchor_ms = (time.perf_counter() - t0) / timed * 1e3
        positions = [torch.tensor([p + i], device="cuda") for i in range(profiled)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for pos in positions:                       # the compiled call alone, nothing synchronizing
            tok, _ = step(model, tok, pos)
        host_ms = (time.perf_counter() - t0) / profiled * 1e3
        torch.cuda.synchronize()
        p += profiled
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                tok, _ = step(model, tok, torch.tensor([p], device="cuda")); p += 1
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in kernels) / profiled / 1e3
    print(f"== {spec}: {anchor_ms:.3f} ms/step as the anchor times it, host {host_ms:.3f} ms per compiled call, "
          f"kernels {gpu_ms:.3f} ms and {len(kernels) / profiled:.0f} per step", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    for spec in (sys.argv[1] if len(sys.argv) > 1 else "inductor@reduce-overhead+clone,ember@reduce-overhead").split(","):
        probe(spec)
