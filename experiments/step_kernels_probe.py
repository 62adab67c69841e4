"""On a GPU: one anchor model's training step (anchor_models.py's config, its mean-square loss) under one
backend: the median step (CUDA events, 10 steps), and over 3 profiled steps the kernel time per step by kind
(products, attention, Triton, other) and the top kernels.
Usage: python -m experiments.step_kernels_probe MODEL BACKEND[@MODE]   (e.g. bert_base ember@reduce-overhead,
eager). ANCHOR_MODELS: the path of anchor_models.py (default ../shared/bench/anchor_models.py)."""
import importlib.util, os, re, sys, torch
spec = importlib.util.spec_from_file_location(
    "anchor_models", os.environ.get("ANCHOR_MODELS", os.path.join("..", "shared", "bench", "anchor_models.py")))
am = importlib.util.module_from_spec(spec)
spec.loader.exec_module(am)
import ember  # noqa: F401 - registers the "ember" backend
name, backend = sys.argv[1], sys.argv[2]
be, _, cmode = backend.partition("@")
torch.manual_seed(0)
model, inputs = am.build(name, "train", "cuda"); model = model.cuda().train()
fn = model if be == "eager" else torch.compile(model, backend=be, mode=cmode or None)
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = am.first_tensor(fn(*inputs)).float().pow(2).mean()
    loss.backward()
for _ in range(6): step()
torch.cuda.synchronize()
ts = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3): step()
    torch.cuda.synchronize()
tab = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        k = e.name[:100]; t = tab.setdefault(k, [0, 0.0]); t[0] += 1; t[1] += e.device_time
def cat(k):
    kl = k.lower()
    if any(s in kl for s in ("gemm", "cutlass", "nvjet", "sm90_x", "cublas", "matmul", "mm_")): return "gemm"
    if "flash" in kl or "fmha" in kl or "attention" in kl or "cudnn" in kl: return "attn"
    if kl.startswith("triton") or re.fullmatch(r"kernel\d+", kl): return "triton"     # ember's are kernelN
    return "other"
cats = {}
for k, (n, t) in tab.items():
    c = cats.setdefault(cat(k), [0, 0.0]); c[0] += n; c[1] += t
tot = sum(v[1] for v in tab.values())
print(f"== {name} {backend}: step median {ts[len(ts)//2]:.2f} ms, GPU kernels {tot/3/1000:.2f} ms/step, launches {sum(v[0] for v in tab.values())//3}/step")
for c, (n, t) in sorted(cats.items(), key=lambda kv: -kv[1][1]):
    print(f"   {c:7s} {t/3/1000:8.3f} ms {n//3:5d}x")
for k, (n, t) in sorted(tab.items(), key=lambda kv: -kv[1][1])[:45]:
    print(f"{t/3/1000:8.3f} ms {n//3:4d}x  {k}")
