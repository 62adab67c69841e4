"""On a GPU: a cold first call of an anchor model compiled by ember, with the compile pool's timeline: when
the graph reached ember, when the zygote and the pool started, when each worker first answered, and when
each graph's kernels were sent to the pool and came back. Seconds since the first call began.

    python -m experiments.compile_pool_timeline MODEL MODE [--runs N]

MODEL MODE as anchor_models.py names them (gpt2 infer, bert_base train, ...); each run is a fresh process
with empty ember and Triton caches. ANCHOR_MODELS: the path of anchor_models.py (default
../shared/bench/anchor_models.py).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def one_run(name: str, mode: str) -> None:
    import torch
    from experiments.anchor_module import anchor
    am = anchor()
    # as in the bench: the model is on the GPU when ember is imported (torch.compile's backend lookup)
    model, inputs = am.build(name, mode, "cuda")
    model = model.cuda()
    if mode == "infer":
        model = model.to(torch.bfloat16).eval()
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    imported = time.time()
    import ember
    from ember import dynamo
    from ember.runtime import compile_pool
    start = [time.time()]
    events = []

    def at() -> float:
        return time.time() - start[0]

    def wrap(owner, attr, before=None, after=None):
        original = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            if before:
                before(*args)
            t = at()
            result = original(*args, **kwargs)
            if after:
                after(t, result, *args)
            return result
        setattr(owner, attr, wrapped)

    wrap(compile_pool, "start", before=lambda: compile_pool._pool or events.append(("pool start", at())))
    wrap(compile_pool, "precompile",
         after=lambda t, r, module, helpers, kernels: events.append((f"{len(kernels)} kernels sent / back", t, at())))
    jobs = []       # (asked, answered, kernel and config) per job, after its worker was ready
    original_ask = compile_pool._Process.ask

    def ask(self, job):
        if self.pid is None:
            self.pid = self._read(compile_pool.BOOT_TIMEOUT_S)["ready"]
            events.append(("worker ready", at()))
        t = at()
        answer = original_ask(self, job)
        jobs.append((t, at(), f"{job['kernel']} {job['configs'][0]}"))
        return answer
    compile_pool._Process.ask = ask
    if hasattr(compile_pool, "_Zygote"):
        wrap(compile_pool._Zygote, "__init__", before=lambda *a: events.append(("zygote start", at())))

    def backend(gm, example_inputs):
        events.append(("graph reaches ember", at()))
        return dynamo.ember_backend(gm, example_inputs)
    backend.__wrapped__ = dynamo.ember_backend      # ember's own: its zygote boots when Dynamo starts

    compiled = torch.compile(model, backend=backend)
    start[0] = time.time()
    if compile_pool._zygote:
        events.append(("zygote start (at import)", imported - start[0]))
    if mode == "infer":
        with torch.no_grad():
            compiled(*inputs)
    else:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = am.first_tensor(compiled(*inputs)).float().pow(2).mean()
        loss.backward()
    torch.cuda.synchronize()
    print(f"{name} {mode}: first call {at():.2f} s, ember's compile {ember.metrics.compile_seconds:.2f} s, "
          f"kernel compile/load {ember.metrics.compile_stage_seconds.get('kernel compile/load', 0.0):.2f} s")
    ready = [e[1] for e in events if e[0] == "worker ready"]
    for event in events:
        if event[0] != "worker ready":
            print(f"  {event[0]:28} " + " / ".join(f"{t:.2f}" for t in event[1:]))
    if ready:
        print(f"  {len(ready)} workers first answered  {min(ready):.2f} .. {max(ready):.2f}")
    if jobs:
        took = sorted(b - a for a, b, _ in jobs)
        print(f"  {len(jobs)} jobs asked {min(a for a, _, _ in jobs):.2f} .. {max(a for a, _, _ in jobs):.2f}, "
              f"answered by {max(b for _, b, _ in jobs):.2f}; each took {took[0]:.2f} / {took[len(took) // 2]:.2f} / "
              f"{took[-1]:.2f} s (min / median / max); the longest:")
        for a, b, what in sorted(jobs, key=lambda j: j[0] - j[1])[:3]:
            print(f"    {b - a:.2f} s  {what}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("mode", choices=("infer", "train"))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a run, in this process
    a = ap.parse_args()
    if a.one:
        one_run(a.model, a.mode)
        return
    for _ in range(a.runs):
        with tempfile.TemporaryDirectory() as caches:
            env = dict(os.environ, EMBER_CACHE_DIR=os.path.join(caches, "ember"),
                       TRITON_CACHE_DIR=os.path.join(caches, "triton"))
            subprocess.run([sys.executable, "-m", "experiments.compile_pool_timeline", a.model, a.mode, "--one"],
                           env=env, check=False)


if __name__ == "__main__":
    main()
