"""One training step's first call on the GPU, split into forward and backward, with Dynamo's compile-time
table, for one backend and model. Run it twice with the same cache directories (EMBER_CACHE_DIR,
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) for a cold and a warm start; each run saves the loss and every
gradient, and `--compare A.pt B.pt` reports how far two runs' gradients are apart.

    python -m experiments.warm_start_probe {ember,inductor} {bert_base,gpt2} OUT   # writes OUT.pt
    python -m experiments.warm_start_probe --compare A.pt B.pt
    EMBER_PROFILE_BACKEND=1 ...      # also a cProfile of ember's backend call (cumulative and own time)
"""
import json
import os
import sys
import time


def compare(a_path: str, b_path: str) -> None:
    import torch
    a, b = torch.load(a_path), torch.load(b_path)
    rows = []
    for k in a:
        x, y = a[k].float(), b[k].float()
        rows.append((((x - y).norm() / y.norm().clamp_min(1e-30)).item(), k, torch.equal(a[k], b[k])))
    rows.sort(reverse=True)
    print(f"{sum(r[2] for r in rows)}/{len(rows)} bitwise equal; largest relative differences:",
          [(k, f"{d:.2e}") for d, k, _ in rows[:4]])


def _profile_backend():
    import atexit
    import cProfile
    import io
    import pstats
    import ember.dynamo as backend
    profile = cProfile.Profile()
    compile_graph = backend._compile_dynamo_graph

    def profiled(*args, **kwargs):
        profile.enable()
        try:
            return compile_graph(*args, **kwargs)
        finally:
            profile.disable()

    def report():
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(20)
        print(out.getvalue())

    backend._compile_dynamo_graph = profiled
    atexit.register(report)


def main(backend: str, name: str, out: str) -> None:
    start = time.perf_counter()
    import torch
    if backend == "ember":
        import ember
    torch.manual_seed(0)
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig()).cuda().train()
        x = torch.randint(0, 30000, (16, 512), device="cuda")
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).cuda().train()
        x = torch.randint(0, 50000, (8, 1024), device="cuda")
    compiled = torch.compile(model, backend=backend)
    if backend == "ember" and os.environ.get("EMBER_PROFILE_BACKEND"):
        _profile_backend()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = compiled(x)
        loss = (o.last_hidden_state if hasattr(o, "last_hidden_state") else o.logits).float().pow(2).mean()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    loss.backward()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    torch.save({"loss": loss.detach().cpu(), **{n: p.grad.detach().cpu() for n, p in model.named_parameters()
                                                if p.grad is not None}}, out + ".pt")
    extra = {}
    if backend == "ember":
        extra = {"compile_s": round(ember.metrics.compile_seconds, 2), "whole_graph_hits": ember.metrics.whole_graph_hits,
                 "graph_cache_hits": ember.metrics.graph_cache_hits}
    print(json.dumps({"backend": backend, "model": name, "imports_s": round(t0 - start, 2),
                      "first_forward_s": round(t1 - t0, 2), "first_backward_s": round(t2 - t1, 2),
                      "first_call_s": round(t2 - t0, 2), **extra}), flush=True)
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        main(*sys.argv[1:4])
