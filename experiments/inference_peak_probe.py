"""Peak memory of bf16 inference, eager against ember, on the CPU, for the LM anchors of
../shared/bench/anchor_models.py (GPT-2 and Llama-small, fewer layers, same batch, sequence and vocabulary).

Two measurements:
  step   one inference call under no_grad, its peak above what was allocated before (ember.testing.peak_bytes),
         the output of an earlier call held (as the bench holds `out0` while it times later steps)
  bench  the bench's run_case memory sequence replayed: for a compiled backend it first runs the eager model
         for an accuracy reference kept in fp32 and computes the relative error of the first output in fp32;
         peak of the whole case above the weights, split into the accuracy check and the timed steps
    python -m experiments.inference_peak_probe gpt2|llama [--layers N] [--replay]
Also the plan of each compiled inference graph (ember/codegen/planned_peak.py), for the C++ backend and for
cpu_backend="triton", whose pass decisions (matmul padding) are a GPU's; the graphs are not run."""
import sys

import torch

import ember
from ember.testing import cpu_allocations, peak_bytes

GIB = 2 ** 30


def build(name, layers):
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(n_layer=layers))
        x = torch.randint(0, 50000, (8, 1024))
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                          num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                          max_position_embeddings=2048)
        m = LlamaForCausalLM(cfg)
        x = torch.randint(0, 32000, (8, 1024))
    return m.to(torch.bfloat16).eval(), x


def allocated_and_peak(fn):
    """(bytes allocated when fn starts, most bytes allocated at once while it runs), absolute, from the
    profiler's record of every CPU allocation (None, None when fn allocates nothing)."""
    events = cpu_allocations(fn)
    if not events:
        return None, None
    return events[0]["Total Allocated"] - events[0]["Bytes"], max(e["Total Allocated"] for e in events)


def bench_replay(model, fn_model, x, compiled: bool):
    """anchor_models.run_case's tensors, phase by phase: -> [(phase, peak above the weights in GiB)]."""
    from torch.profiler import ProfilerActivity, profile
    import gc
    gc.collect()
    box = {}
    phases = []

    def phase(what, f):
        start, peak = allocated_and_peak(f)
        phases.append((what, peak))
        box.setdefault("base", start)

    def step():
        return fn_model(x).logits
    if compiled:
        phase("ref = eager(x).float()", lambda: box.__setitem__("ref", model(x).logits.float()))
    phase("out0 = step()", lambda: box.__setitem__("out0", step()))
    if compiled:
        phase("rel_err in fp32", lambda: ((box["out0"].float() - box["ref"]).norm() /
                                          box["ref"].norm().clamp_min(1e-12)).item())
    def timed_steps():
        for _ in range(2):
            step()                  # each result dropped, as the bench's timing loop does
    phase("timed steps", timed_steps)
    base = phases and box["base"]
    return [(w, (p - base) / GIB) for w, p in phases]


def planned(model, x, cpu_backend: str):
    """Compile `model` for `cpu_backend` without running its kernels: -> [(graph kind, PlannedPeak, origin)]
    for each graph (the graph itself then runs eagerly: the probe stops ember after code generation)."""
    import torch._dynamo
    cg = sys.modules["ember.compile_graph"]     # the module (ember.compile_graph is also the function)
    from ember.codegen.nan_checks import ValueOrigins
    from ember.codegen.planned_peak import buffer_bytes, planned_peak
    found = []
    generate = cg._generate

    class Planned(Exception):
        pass

    def capture(gm, example_inputs, kind, *rest):
        gm, program, builder = generate(gm, example_inputs, kind, *rest)
        lowering, origins = builder.g, ValueOrigins(builder.g)

        def origin(name):
            try:
                return origins.describe(name, lowering.get_buffer(name))
            except Exception:
                return name
        found.append((kind, planned_peak(program, buffer_bytes(lowering)), origin))
        raise Planned()
    torch._dynamo.reset()
    cg._generate = capture
    try:
        with ember.config.patch(cpu_backend=cpu_backend, fallback_on_error=True, graph_cache=False), torch.no_grad():
            torch.compile(model, backend="ember")(x)
    finally:
        cg._generate = generate
        torch._dynamo.reset()
    return found


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=("gpt2", "llama"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--replay", action="store_true", help="also replay the bench's run_case (slow)")
    a = ap.parse_args()
    model, x = build(a.model, a.layers)
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        ref = model(x).logits
        got = compiled(x).logits
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        del got
        print(f"{a.model} {a.layers} layers: logits {tuple(ref.shape)} {ref.dtype} = {ref.nbytes / GIB:.3f} GiB, "
              f"rel err {err:.2e}", flush=True)
        # `ref` stays alive: the step peaks are measured with one earlier output held, as the bench holds out0
        eager = peak_bytes(lambda: model(x).logits)
        comp = peak_bytes(lambda: compiled(x).logits)
        print(f"  step peak: eager {eager / GIB:.3f} GiB, ember (C++) {comp / GIB:.3f} GiB ({comp / eager:.3f}x)",
              flush=True)
        from ember.codegen.planned_peak import describe
        # cpu_backend="triton" plans the graph as for a GPU (its matmul alignment pads as on a GPU)
        for backend in ("cpp", "triton"):
            for kind, peak, origin in planned(model, x, backend):
                print(f"  {backend} {kind} graph: planned peak {peak.bytes / GIB:.3f} GiB "
                      f"({peak.bytes / eager:.3f}x eager's step peak)\n    " + describe(peak, origin, top=4),
                      flush=True)
        if a.replay:
            for label, fn_model, compiled_ in (("eager", model, False), ("ember", compiled, True)):
                rows = bench_replay(model, fn_model, x, compiled_)
                print(f"  bench replay, {label}: " + "; ".join(f"{w}: {p:.3f}" for w, p in rows) +
                      f"  -> case peak {max(p for _, p in rows):.3f} GiB above the weights", flush=True)


if __name__ == "__main__":
    main()
