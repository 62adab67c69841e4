"""Where ember's host time per step goes, by switching parts of the generated wrapper off. Needs a CUDA GPU:
    python -m experiments.host_split_probe MODEL infer [--batch B]
(MODEL and MODE as scripts/profile_model.py takes them; inference graphs.) After compiling and warming up,
the wrapper's globals are patched step by step: kernel launches off (every call site a no-op), layout checks
off (`conform_layout` returns its tensor), ATen calls off (each returns its first argument). Host ms per
step (back-to-back steps, no sync; best of interleaved rounds) for each, then inductor's for scale; the
differences are what each part costs. The patched steps compute nothing: only their host time means
anything."""
import argparse
import functools
import gc
import types

from benchmarks import models as M
from experiments.host_ops_probe import host_ms as host_ms_on


def wrapper_globals() -> list:
    """The globals of every generated wrapper's `call` (found among live objects; proxies skipped)."""
    found = []
    for f in gc.get_objects():
        try:
            if type(f) is types.FunctionType and f.__name__ == "call" and "conform_layout" in f.__globals__:
                found.append(f.__globals__)
        except ReferenceError:
            pass
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=M.MODELS + ["mlp"])
    ap.add_argument("mode", choices=["infer"])
    ap.add_argument("--batch", type=int)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (--small models)")
    a = ap.parse_args()
    host_ms = functools.partial(host_ms_on, n=20, device=a.device)
    model, inp = M.model_and_inputs(a.model, a.mode, a.device, a.device == "cpu", a.batch)
    step = M.warm_step(model, inp, a.mode, "ember", a.device)
    scopes = wrapper_globals()
    saved = [dict(g) for g in scopes]
    noop = lambda *args, **kw: None          # noqa: E731
    first = lambda *args, **kw: args[0]      # noqa: E731

    def patch(level):
        for g, orig in zip(scopes, saved):
            g.update(orig)
            for name, obj in orig.items():
                if level >= 1 and "_site" in name and callable(obj):
                    g[name] = noop
                if level >= 1 and hasattr(obj, "run") and name.startswith("kernel"):
                    g[name] = types.SimpleNamespace(run=noop)
                if level >= 2 and name == "conform_layout":
                    g[name] = first
                if level >= 3 and name.startswith("aten_"):
                    g[name] = first
    labels = ["ember", "launches off", "and layout checks off", "and ATen calls off"]
    best = {k: float("inf") for k in labels}
    for _ in range(a.rounds):
        for level, label in enumerate(labels):
            patch(level)
            best[label] = min(best[label], host_ms(step))
    patch(0)
    print(f"{a.model} {a.mode}: {len(scopes)} wrapper(s); host ms per step, best of {a.rounds} rounds")
    for label in labels:
        print(f"  {label:26s} {best[label]:.3f}")
    istep = M.warm_step(model, inp, a.mode, "inductor", a.device)
    print(f"  {'inductor':26s} {min(host_ms(istep) for _ in range(a.rounds)):.3f}")
    print(f"  {'eager':26s} {min(host_ms(M.warm_step(model, inp, a.mode, 'eager', a.device)) for _ in range(3)):.3f}")


if __name__ == "__main__":
    main()
