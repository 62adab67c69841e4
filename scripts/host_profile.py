"""Host time of one step of a benchmarks/models.py model, per backend: wall per step (back to back, as the
models benchmark times it), the host's own time per step, and a cProfile of a few steps:
    python scripts/host_profile.py bert train inductor,ember [--steps 20] [--top 30]
On the GPU machines we measure on, transformer steps are bound by host time (BERT training: ~7.6 ms of GPU
work in a ~22 ms step), so this is where a backend's wall time goes.
"""
import cProfile, io, os, pstats, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, ember  # noqa: F401  (registers the backend)
import benchmarks.models as M


def main():
    a = M.probe_arguments(steps=20, top=30)
    init, inp = M.model_and_inputs(a.model, a.mode)
    for be in a.backends.split(","):
        step = M.warm_step(init, inp, a.mode, be)
        wall, _ = M.timed_block(step, a.steps, "cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        host = (time.perf_counter() - t0) * 1e3 / a.steps
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        prof.disable()
        print(f"=== {a.model} {a.mode} {be}: wall {wall:.2f} ms per step, host {host:.2f} ms per step")
        for order in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(order).print_stats(a.top)
            text = s.getvalue()
            print(f"--- by {order} (cProfile, {a.steps} steps)")
            print(text[text.find("ncalls"):] if "ncalls" in text else text)


if __name__ == "__main__":
    main()
