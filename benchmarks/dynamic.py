"""Dynamic shapes on real models (GPU): one `dynamic=True` compile serving several sequence lengths,
timed against a static compile per length. Needs `transformers` (random weights from configs).

    python -m benchmarks.dynamic --models gpt2,bert --seqs 128,384,512,1000 [--out dyn.json]
"""
import argparse
import json
import statistics
import time

import torch

import ember


def build(name, device):
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config()).to(device).eval(), 50257
    if name == "bert":
        from transformers import BertConfig, BertModel
        return BertModel(BertConfig(max_position_embeddings=1024)).to(device).eval(), 30522  # seq 1000 needs > 512 positions
    raise KeyError(name)


def first(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def timeit(fn, *args, iters=20):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,bert")
    ap.add_argument("--seqs", default="128,384,512,1000")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=50,
                    help="timed calls per measurement (median); these sizes are host-bound, so more is steadier")
    ap.add_argument("--out")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    rows = []
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, vocab = build(name, "cuda")
        model = model.to(torch.bfloat16)
        inputs = {s: torch.randint(0, vocab, (a.batch, s), device="cuda") for s in seqs}
        with torch.no_grad():
            # one dynamic compile for every length
            torch._dynamo.reset()
            ember.metrics.reset()
            dyn = torch.compile(model, backend="ember", dynamic=True)
            t0 = time.time()
            dyn(inputs[seqs[0]])
            dyn_compile = time.time() - t0
            dyn_res = {}
            for s in seqs:
                ref = first(model(inputs[s])).float()
                out = first(dyn(inputs[s])).float()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                dyn_res[s] = (timeit(dyn, inputs[s], iters=a.iters), err)
            compiles = ember.metrics.graphs_compiled
            # a static compile per length, for comparison
            for s in seqs:
                torch._dynamo.reset()
                static = torch.compile(model, backend="ember", dynamic=False)
                t0 = time.time()
                static(inputs[s])
                static_compile = time.time() - t0
                static_ms = timeit(static, inputs[s], iters=a.iters)
                eager_ms = timeit(model, inputs[s], iters=a.iters)
                dyn_ms, err = dyn_res[s]
                row = dict(model=name, seq=s, dynamic_ms=dyn_ms, static_ms=static_ms, eager_ms=eager_ms,
                           dyn_over_static=dyn_ms / static_ms, dynamic_compiles=compiles, rel_err=err,
                           dynamic_compile_s=dyn_compile, static_compile_s=static_compile)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'model':6} {'seq':>5} {'dynamic ms':>11} {'static ms':>10} {'eager ms':>9} {'dyn/static':>10} "
          f"{'compiles':>8} {'rel err':>8}")
    for r in rows:
        print(f"{r['model']:6} {r['seq']:5d} {r['dynamic_ms']:11.3f} {r['static_ms']:10.3f} {r['eager_ms']:9.3f} "
              f"{r['dyn_over_static']:10.2f} {r['dynamic_compiles']:8d} {r['rel_err']:8.1e}")
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
