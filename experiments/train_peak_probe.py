"""On a GPU: what is live at the peak of one training step of an anchor model, per backend.

    python -m experiments.train_peak_probe MODEL BACKEND [--lm-loss ce] [--top N] [--first-call]

The step is anchor_models.py's (bf16 autocast; `--lm-loss ce`: the model's own shifted cross-entropy). The
first call runs, then the step once more with the CUDA caching allocator's history recorded; its events are
replayed to find the moment of the peak, and the blocks live then are listed, largest first, each with the
innermost frames that allocated it outside torch's own files (a compiled graph's allocations show the
wrapper's line); `--first-call` lists the first call's peak the same way (compile included). Prints the first call's peak, the step's peak, what was allocated before the step, and
the table. ANCHOR_MODELS: the path of anchor_models.py (default ../shared/bench/anchor_models.py).
"""
import argparse
import collections

import torch

GIB = 2 ** 30


def _frames(event, keep: int = 3) -> str:
    frames = [f for f in event.get("frames", []) if f["filename"].endswith(".py")
              and "/torch/" not in f["filename"] and "/site-packages/triton" not in f["filename"]]
    return " < ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in frames[:keep])


def live_at_peak(trace: list):
    """Replay allocator events: (peak bytes above the start, [events live at the peak])."""
    live, total, peak, at_peak = {}, 0, 0, {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])["size"]
    return peak, list(at_peak.values())


def _table(live: list, top: int) -> None:
    by_site = collections.defaultdict(lambda: [0, 0])
    for ev in live:
        site = _frames(ev)
        by_site[site][0] += ev["size"]
        by_site[site][1] += 1
    print(f"{'GiB':>7} {'blocks':>6}  allocated at")
    for site, (size, n) in sorted(by_site.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{size / GIB:7.3f} {n:6d}  {site}")
    print("largest blocks live at the peak:")
    for ev in sorted(live, key=lambda e: -e["size"])[:top]:
        print(f"{ev['size'] / GIB:7.3f}  {_frames(ev, keep=6)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("backend")
    ap.add_argument("--lm-loss", default="pow2")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--first-call", action="store_true", help="also list what is live at the first call's peak")
    a = ap.parse_args()
    from experiments.anchor_module import anchor
    am = anchor()
    torch.manual_seed(0)
    model, inputs = am.build(a.model, "train", "cuda")
    model = model.cuda().train()
    be = am.resolve_backend(a.backend)
    fn = model if be is None else torch.compile(model, backend=be)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if a.lm_loss == "ce":
                loss = fn(*inputs, labels=inputs[0]).loss
            else:
                loss = am.first_tensor(fn(*inputs)).float().pow(2).mean()
        loss.backward()

    def recorded_step():
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        return live_at_peak(snap["device_traces"][torch.cuda.current_device()])

    if a.first_call:
        peak, live = recorded_step()
        print(f"first call: its own peak from the trace {peak / GIB:.2f} GiB in {len(live)} blocks")
        _table(live, a.top)
    else:
        step()
        torch.cuda.synchronize()
    first_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    peak, live = recorded_step()
    step_peak = torch.cuda.max_memory_allocated()
    print(f"{a.model} {a.backend} lm_loss={a.lm_loss}: first call peak {first_peak / GIB:.2f} GiB, "
          f"step peak {step_peak / GIB:.2f} GiB, allocated before the step {before / GIB:.2f} GiB, "
          f"step's own peak from the trace {peak / GIB:.2f} GiB in {len(live)} blocks")
    _table(live, a.top)


if __name__ == "__main__":
    main()
