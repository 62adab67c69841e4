"""Top GPU kernels of one step of a benchmarks/models.py model, per backend (torch.profiler, 5 steps):
    python scripts/profile_model.py convnext infer [eager,inductor,ember]
"""
import sys, os, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, ember
import benchmarks.models as M
from torch.profiler import profile, ProfilerActivity
name, mode = sys.argv[1], sys.argv[2]
backends = sys.argv[3].split(",") if len(sys.argv) > 3 else ["eager", "inductor", "ember"]
init, inp = M.model_and_inputs(name, mode)
for be in backends:
    step = M.warm_step(init, inp, mode, be)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    rows = [(e.self_device_time_total / 5, e.count // 5, e.key) for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"=== {name} {mode} {be}: GPU {total / 1e3:.3f} ms per step, {sum(r[1] for r in rows)} kernel launches")
    for us, n, key in rows[:22]:
        print(f"  {us:9.1f} us  x{n:3}  {key[:110]}")
