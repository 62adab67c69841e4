"""One anchor model's training step (anchor_models.py's config) under ember and ember@reduce-overhead, on a
GPU: median ms per synchronized step, host ms per step (no synchronization), the GPU's kernel ms per step (torch
profiler), the CUDA-graph counters, each runner's copied inputs and output kinds, and the top kernels.
Usage: python experiments/cudagraph_step_probe.py MODEL [profile]   (MODEL as anchor_models.py names it;
`profile` adds the host's top Python functions under reduce-overhead; SKIP_DEFAULT=1 runs reduce-overhead
only). ANCHOR_MODELS: the path of
anchor_models.py (default ../shared/bench/anchor_models.py)."""
import importlib.util, os, sys, time, cProfile, pstats, io, logging, torch
_spec = importlib.util.spec_from_file_location(
    "anchor_models", os.environ.get("ANCHOR_MODELS", os.path.join("..", "shared", "bench", "anchor_models.py")))
am = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)
import ember

def go(mode, prof=False):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs = am.build(sys.argv[1], "train", "cuda")
    model = model.cuda().train()
    fm = torch.compile(model, backend="ember", mode=mode)
    import logging
    if mode:
        logging.basicConfig(); logging.getLogger("ember.cudagraphs").setLevel(logging.DEBUG)
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = am.first_tensor(fm(*inputs)).float().pow(2).mean()
        loss.backward()
    for _ in range(8):
        step()
    torch.cuda.synchronize()
    warm_records = ember.metrics.cudagraph_records
    times = []
    for _ in range(10):
        t = time.perf_counter()
        step(); torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    wall = sorted(times)[len(times) // 2] * 1e3     # median: a step that records is not a steady step
    print(f"   records in 8 warm-up steps {warm_records}, in the 10 timed ones {ember.metrics.cudagraph_records - warm_records}")
    # host time alone: steps without a sync between them, timed on the host until the last launch
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        step()
    host = (time.perf_counter() - t) / 10 * 1e3
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    gpu = sum(e.device_time for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 5 / 1e3
    print(f"== mode={mode}: wall {wall:.2f} ms/step (synced), host-only {host:.2f} ms/step, kernel time {gpu:.2f} ms/step,"
          f" records {ember.metrics.cudagraph_records} replays {ember.metrics.cudagraph_replays} copies {ember.metrics.cudagraph_output_copies} partitions {ember.metrics.cudagraph_partitions} peak {torch.cuda.max_memory_allocated()/2**30:.2f}", flush=True)
    ember.metrics.reset(); torch.cuda.reset_peak_memory_stats()
    import gc
    from ember.runtime import cudagraphs as cgm
    for o in gc.get_objects():
        try:
            if type(o) is cgm.CudaGraphRunner:
                for e in o.sizes.values():
                    r = e.recording
                    if r is not None:
                        print("   runner", o.label, "inputs in place", len(r.addresses), "copied", {i: (tuple(b.shape), str(b.dtype)) for i, b in r.buffers.items()},
                              "outputs", len(r.outputs), "kinds", {k: sum(1 for x in r.outputs if x.kind == k) for k in ("pool", "arg", "buffer", "value")},
                              "copy_outputs", sorted(o.copy_outputs), "consumed", len(r.consumed), "dead_before", len(r.dead_before))
        except ReferenceError:
            pass
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))
    if prof:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(10):
            step(); torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue()[:6000])

if not os.environ.get("SKIP_DEFAULT"):
    go(None)
go("reduce-overhead", prof=len(sys.argv) > 2)
