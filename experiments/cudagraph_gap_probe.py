"""One anchor model's training step under ember (default / reduce-overhead): where the GPU idles.

    python experiments/cudagraph_gap_probe.py MODEL MODE OUTDIR [stacks]   (MODE: default | ro)

Prints each warm-up step's peak memory (forward and backward apart) and the CUDA-graph counters, the median
step (CUDA events) and the host time per step without synchronization; then profiles two steps (CPU and
CUDA; Python stacks with `stacks`), writes the trace to OUTDIR/trace_MODEL_MODE.json.gz and lists each GPU
idle interval over 100 us with the host work (self time) that ran in it. ANCHOR_MODELS: the path of
anchor_models.py (default ../shared/bench/anchor_models.py)."""
import collections, gzip, importlib.util, json, logging, os, sys, time
import torch
_spec = importlib.util.spec_from_file_location(
    "anchor_models", os.environ.get("ANCHOR_MODELS", os.path.join("..", "shared", "bench", "anchor_models.py")))
am = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)
import ember

name, mode, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
cmode = "reduce-overhead" if mode == "ro" else None
torch.manual_seed(0)
model, inputs = am.build(name, "train", "cuda")
model = model.cuda().train()
fm = torch.compile(model, backend="ember", mode=cmode)
if cmode:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("ember.cudagraphs").setLevel(logging.DEBUG)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = am.first_tensor(fm(*inputs)).float().pow(2).mean()
    loss.backward()


G = 2**30
for i in range(6):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); m0 = torch.cuda.memory_allocated() / G
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = am.first_tensor(fm(*inputs)).float().pow(2).mean()
    torch.cuda.synchronize(); pf = torch.cuda.max_memory_allocated() / G; mf = torch.cuda.memory_allocated() / G
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    del loss
    torch.cuda.synchronize()
    print(f"warm step {i}: start {m0:.3f} fwd peak {pf:.3f} after fwd {mf:.3f} bwd peak {torch.cuda.max_memory_allocated()/G:.3f} now {torch.cuda.memory_allocated()/G:.3f}"
          f" records {ember.metrics.cudagraph_records} replays {ember.metrics.cudagraph_replays} copies {ember.metrics.cudagraph_output_copies}", flush=True)
torch.cuda.reset_peak_memory_stats()
ts = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); step(); e.record(); torch.cuda.synchronize()
    ts.append(s.elapsed_time(e))
ts.sort()
t = time.perf_counter()
for _ in range(10):
    step()
host = (time.perf_counter() - t) / 10 * 1e3
torch.cuda.synchronize()
print(f"== {name} {mode}: event ms median {ts[10]:.2f} min {ts[0]:.2f}; host-only {host:.2f} ms/step; peak "
      f"{torch.cuda.max_memory_allocated()/2**30:.3f} GiB; records {ember.metrics.cudagraph_records} replays "
      f"{ember.metrics.cudagraph_replays} copies {ember.metrics.cudagraph_output_copies}", flush=True)

acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts, with_stack=len(sys.argv) > 4) as p:
    for _ in range(2):
        s = torch.cuda.Event(); s.record()
        torch.cuda.synchronize()
        with torch.profiler.record_function("STEP"):
            step()
        torch.cuda.synchronize()
path = os.path.join(outdir, f"trace_{name}_{mode}.json")
p.export_chrome_trace(path)
with open(path) as f:
    tr = json.load(f)
with gzip.open(path + ".gz", "wt") as f:
    json.dump(tr, f)
os.remove(path)
ev = tr["traceEvents"]
gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
steps = sorted((e for e in ev if e.get("name") == "STEP" and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
launch = {}
for e in ev:
    if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
        launch[e["args"]["correlation"]] = e
cpu = [e for e in ev if e.get("cat") in ("cpu_op", "python_function", "user_annotation") and "dur" in e]
for st in steps:
    t0, t1 = st["ts"], st["ts"] + st["dur"]
    ks = [k for k in gpu if t0 <= k["ts"] <= t1 + 50000]
    busy = sum(k["dur"] for k in ks)
    first = ks[0]["ts"] - t0 if ks else -1
    end = max(k["ts"] + k["dur"] for k in ks)
    print(f"-- step: host {st['dur']/1e3:.2f} ms, first kernel at +{first/1e3:.3f} ms, last kernel ends +{(end-t0)/1e3:.2f} ms,"
          f" {len(ks)} kernels, busy {busy/1e3:.2f} ms")
    prev_end = t0
    gaps = []
    for k in ks:
        if k["ts"] - prev_end > 30:
            gaps.append((prev_end, k))
        prev_end = max(prev_end, k["ts"] + k["dur"])
    tot = 0
    for g0, k in gaps:
        gl = k["ts"] - g0
        tot += gl
        la = launch.get(k.get("args", {}).get("correlation"))
        lts = la["ts"] if la else k["ts"]
        # the host work between the gap's start and the launch that ended it: python functions, by self time
        inside = [c for c in cpu if c["ts"] < lts and c["ts"] + c["dur"] > g0]
        agg = collections.Counter()
        incl = {id(c): min(c["ts"] + c["dur"], lts) - max(c["ts"], g0) for c in inside}
        selfs = dict(incl)
        stack = []
        for c in sorted(inside, key=lambda c: (c.get("tid"), c["ts"], -c["dur"])):
            while stack and (stack[-1].get("tid") != c.get("tid") or stack[-1]["ts"] + stack[-1]["dur"] <= c["ts"]):
                stack.pop()
            if stack:
                selfs[id(stack[-1])] -= incl[id(c)]
            stack.append(c)
        for c in inside:
            agg[c["name"][:90]] += selfs[id(c)]
        if gl < 100:
            continue
        print(f"  gap +{(g0-t0)/1e3:.3f} ms: {gl:.0f} us before {k['name'][:60]} (launch {la['name'] if la else '?'})")
        for n, d in agg.most_common(8):
            print(f"      {d:8.0f} us  {n}")
    print(f"  gaps >30us total {tot/1e3:.2f} ms")
