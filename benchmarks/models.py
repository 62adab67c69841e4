"""Whole models: eager vs inductor vs ember, inference and training, one process, every compiled backend
checked against eager.

    python -m benchmarks.models [--device cuda] [--models resnet50,vit,convnext,bert,gpt2,llama]
        [--modes infer,train] [--backends eager,inductor,ember] [--small] [--json out.json] [--iters N]
        [--budget-s S]     # start no model after S seconds (default 540 on GPU: one 10-minute device command)
    python -m benchmarks.models --device cpu --small --models bert,gpt2,llama       # CPU smoke test

Models have random weights built from torchvision / timm / transformers configs (nothing is downloaded);
one whose package is missing is reported as skipped. `mlp` (a small MLP classifier, not among the six) needs
no model package: the tools' smoke tests (tests/test_tools.py) run it. Dropout is off, so compiled and eager steps compute
the same function. `--small` shrinks every model and input (tiny configs, 64x64 images, seq 32).
- infer: model.eval(), bf16 weights and inputs, torch.no_grad(); images 32x3x224x224, text 8x512.
- train: fp32 weights, forward + backward under bf16 autocast; images 16x3x224x224 (loss: cross-entropy
  of the logits against random classes), text 4x512 (the model's own LM loss, labels = input ids). No
  optimizer step: gradients are reset (set to None) each step, so every step does the same work.

Accuracy, the rule of PyTorch's benchmark runner: a compiled backend's first step (outputs for infer; loss
and every parameter's gradient for train) must be allclose to eager's at the same dtype (rtol = tol,
atol = tol * max|eager| + 1e-6; tol 1e-2 infer, 5e-2 train). A tensor that is not passes if its RMSE
against a float64 reference (eager, the same weights and inputs cast to float64, no autocast) is at most 3x eager's
own RMSE against it, plus tol/10 of the reference's RMS. "pass" = all allclose, "pass~" = some passed only
by the fp64 rule (the worst RMSE ratio compiled/eager is shown), "FAIL" = some passed neither.

Timing: compile s = the first step (Dynamo + AOTAutograd + the backend's compile(s), forward and backward,
until its result is ready). After warm-up steps, `--rounds` rounds each run every backend in turn for N
steps (backends interleaved, so drift hits all alike; N = --iters, else what fits a fixed budget); ms = the
median over rounds of the mean step time (CUDA events on GPU). peak GiB = torch.cuda.max_memory_allocated()
during a backend's timed steps minus what was allocated before them, plus its own weights and the inputs
(as if it were alone on the GPU; the other backends' model copies are resident meanwhile).
Dynamo is reset between models and modes, not between the backends of one: the interleaved rounds need
each backend's compiled code alive (Dynamo keeps a cache entry per backend); recompiles are reported.
"""
from __future__ import annotations

import argparse
import collections
import copy
import gc
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import ember  # registers the backend; imported before triton
from benchmarks.kernels import tensors

bf16 = torch.bfloat16
MODELS = ["resnet50", "vit", "convnext", "bert", "gpt2", "llama"]
IMAGE_MODELS = {"resnet50", "vit", "convnext"}
MLP_FEATURES = 32
TOL = {"infer": 1e-2, "train": 5e-2}
FP64_MULTIPLIER = 3.0


# -- models and inputs ---------------------------------------------------------------------------------------

def build(name: str, small: bool):
    """(fp32 model with random weights, number of classes or vocabulary size). ImportError if a package is missing."""
    if name == "mlp":
        hidden = 64 if small else 1024
        return torch.nn.Sequential(torch.nn.Linear(MLP_FEATURES, hidden), torch.nn.GELU(), torch.nn.LayerNorm(hidden),
                                   torch.nn.Linear(hidden, 10)), 10
    if name == "resnet50":
        import torchvision
        if small:
            from torchvision.models.resnet import Bottleneck, ResNet
            return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10), 10      # resnet50's blocks, one per stage
        return torchvision.models.resnet50(weights=None), 1000
    if name in ("vit", "convnext"):
        import timm
        if name == "vit":
            kw = dict(img_size=64, depth=2, embed_dim=64, num_heads=2, num_classes=10) if small else {}
            model = timm.create_model("vit_base_patch16_224", pretrained=False, **kw)
        else:
            kw = dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), num_classes=10) if small else {}
            model = timm.create_model("convnext_tiny", pretrained=False, **kw)
        return model, model.num_classes
    import transformers
    transformers.logging.set_verbosity_error()
    common = dict(attn_implementation="sdpa", use_cache=False)
    if name == "bert":
        size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    vocab_size=1000) if small else {}
        cfg = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common, **size)
        return transformers.BertForMaskedLM(cfg), cfg.vocab_size
    if name == "gpt2":
        size = dict(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1000, bos_token_id=0,
                    eos_token_id=0) if small else {}
        cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common, **size)
        model = transformers.GPT2LMHeadModel(cfg)
        model.loss_type = cfg.loss_type = "ForCausalLM"   # else a logger.warning_once in the loss breaks the graph
        return model, cfg.vocab_size
    if name == "llama":
        size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=128, vocab_size=1000) if small else \
            dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=32000)
        cfg = transformers.LlamaConfig(max_position_embeddings=2048, attention_dropout=0.0, **common, **size)
        return transformers.LlamaForCausalLM(cfg), cfg.vocab_size
    raise KeyError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def make_inputs(name: str, mode: str, small: bool, n_out: int, device: str, batch: int | None = None) -> dict:
    """One step's inputs; `batch` overrides the batch size (the model anchor runs 64 images, 16 x 512 BERT
    tokens, 8 x 1024 GPT-2 and Llama tokens)."""
    g = torch.Generator().manual_seed(0)
    if name in IMAGE_MODELS or name == "mlp":
        b, hw = (2, 64) if small else (32 if mode == "infer" else 16, 224)
        b = batch or b
        x = torch.randn(b, MLP_FEATURES, generator=g) if name == "mlp" else torch.randn(b, 3, hw, hw, generator=g)
        inp = {"x": x.to(bf16) if mode == "infer" else x, "target": torch.randint(0, n_out, (b,), generator=g)}
    else:
        b, s = (2, 32) if small else (8 if mode == "infer" else 4, 512)
        b = batch or b
        inp = {"input_ids": torch.randint(0, n_out, (b, s), generator=g)}
    return {k: v.to(device) for k, v in inp.items()}


def model_and_inputs(name: str, mode: str, device: str = "cuda", small: bool = False, batch: int | None = None):
    """(model, inputs) of one benchmark step, as scripts/profile_model.py builds it: bf16 weights for inference,
    float32 (trained under bf16 autocast) for training."""
    torch.manual_seed(0)
    m0, n_out = build(name, small)
    model = m0.to(device=device, dtype=bf16 if mode == "infer" else torch.float32).train(mode == "train")
    return model, make_inputs(name, mode, small, n_out, device, batch)


def warm_step(model, inp: dict, mode: str, backend: str, device: str = "cuda"):
    """step() of model compiled by backend ("eager": as is), after three warm-up steps and a sync."""
    torch._dynamo.reset()
    f = model if backend == "eager" else torch.compile(model, backend=backend)

    def step():
        return run_step(f, inp, mode, device)
    for _ in range(3):
        step()
    sync(device)
    return step


def forward(model, inp: dict, train: bool):
    """The model's outputs (infer) or its loss (train)."""
    if "x" in inp:
        out = model(inp["x"])
        return F.cross_entropy(out.float(), inp["target"]) if train else out
    out = model(input_ids=inp["input_ids"], labels=inp["input_ids"] if train else None, return_dict=False)
    return out[0] if train else out


def run_step(model, inp: dict, mode: str, device: str, amp: bool = True):
    if mode == "infer":
        with torch.no_grad():
            return forward(model, inp, False)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=bf16, enabled=amp):
        loss = forward(model, inp, True)
    loss.backward()
    return loss.detach()



def results(model, out, mode: str) -> dict:
    """What accuracy compares: the outputs, or the loss and every parameter's gradient, by name."""
    if mode == "infer":
        return {f"output {i}": t for i, t in enumerate(tensors(out))}
    return {"loss": out, **{n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


def nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree)


# -- accuracy ------------------------------------------------------------------------------------------------

def rmse(a, b) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item() if a.numel() else 0.0


def check(res: dict, ref: dict, mode: str, ref64) -> dict:
    """Compare a backend's results with eager's; `ref64()` gives the float64 reference (built on first need)."""
    tol = TOL[mode]
    n_close, n_fp64, worst, fails = 0, 0, (0.0, ""), []
    first = next(iter(ref))
    acc = {"max_abs_err_" + first.replace(" ", "_"): None}
    for name, e in ref.items():
        r = res.get(name)
        if r is None or r.shape != e.shape:
            fails.append(f"{name}: {'missing' if r is None else list(r.shape)} vs eager {list(e.shape)}")
            continue
        r32, e32 = r.float(), e.float()
        if name == first and e.numel():
            acc["max_abs_err_" + first.replace(" ", "_")] = (r32 - e32).abs().max().item()
        amax = e32.abs().max().item() if e.numel() else 0.0
        if torch.allclose(r32, e32, rtol=tol, atol=tol * amax + 1e-6, equal_nan=True):
            n_close += 1
            continue
        del r32, e32
        e64 = ref64()[name]
        err, err_eager = rmse(r, e64), rmse(e, e64)
        limit = FP64_MULTIPLIER * err_eager + tol / 10 * e64.double().pow(2).mean().sqrt().item()
        ratio = err / err_eager if err_eager > 0 else float("inf")
        if err <= limit:      # NaN fails here
            n_fp64 += 1
            worst = max(worst, (ratio, name))
        else:
            fails.append(f"{name}: RMSE vs fp64 {err:.3g} > limit {limit:.3g} (eager's {err_eager:.3g}, x{ratio:.2f})")
    acc.update(tensors=len(ref), allclose=n_close, fp64_pass=n_fp64, fails=fails)
    if n_fp64:
        acc.update(worst_rmse_ratio=worst[0], worst=worst[1])
    acc["status"] = "FAIL" if fails else ("pass~" if n_fp64 else "pass")
    return acc


def accuracy_cell(acc: dict | None) -> str:
    if not acc:
        return "-"
    if acc["status"] == "FAIL":
        return f"FAIL {len(acc['fails'])}/{acc['tensors']}"
    if acc["status"] == "pass~":
        return f"pass~ x{acc['worst_rmse_ratio']:.2f}"
    return "pass"


# -- one model in one mode -----------------------------------------------------------------------------------

def short(e: BaseException) -> str:
    """The exception in one line: its type and message, less Dynamo's "Set TORCHDYNAMO_VERBOSE..." advice."""
    lines = [ln.strip() for ln in str(e).splitlines()
             if ln.strip() and not ln.startswith(("Set TORCHDYNAMO", "For even"))]
    return f"{type(e).__name__}: {' '.join(lines)[:300]}"


def free(device: str):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_block(step, n: int, device: str):
    """(ms per step over n steps, peak bytes allocated above the start) ; peak None on CPU."""
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            step()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / n, torch.cuda.max_memory_allocated() - start
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) * 1e3 / n, None


def run_group(name: str, mode: str, specs: list, a) -> list:
    dev = a.device
    rows = {s: {"model": name, "mode": mode, "backend": s} for s in specs}
    torch._dynamo.reset()
    torch.manual_seed(0)
    try:
        model0, n_out = build(name, a.small)
    except ImportError as e:
        return [dict(r, skipped=short(e)) for r in rows.values()]
    live, eager_res, cache = {}, None, {}    # backend -> (step, module, estimated ms per step)
    try:
        init = model0.to(device=dev, dtype=bf16 if mode == "infer" else torch.float32).train(mode == "train")
        del model0
        inp = make_inputs(name, mode, a.small, n_out, dev)
        static_bytes = nbytes(inp.values())

        def ref64():      # the float64 reference, built where allclose to eager is not enough
            if "r" not in cache:
                m64 = copy.deepcopy(init).double()
                inp64 = {k: v.double() if v.is_floating_point() else v for k, v in inp.items()}
                cache["r"] = results(m64, run_step(m64, inp64, mode, dev, amp=False), mode)
            return cache["r"]

        for s in specs:
            r = rows[s]
            try:
                model = copy.deepcopy(init)
                f = model if s == "eager" else torch.compile(model, backend=s)
                step = (lambda f=f: run_step(f, inp, mode, dev))
                counters.clear()
                ember.metrics.reset()
                t0 = time.perf_counter()
                out = step()
                sync(dev)
                r["first_step_s"] = time.perf_counter() - t0
                r["graphs"] = counters["stats"]["unique_graphs"]
                r["graph_breaks"] = sum(counters["graph_break"].values())
                r["graph_break_reasons"] = [k.splitlines()[0][:120] for k in counters["graph_break"]][:3]
                res = results(model, out, mode)
                if s == "eager":
                    eager_res = res
                elif eager_res is not None:      # checked now, before another call could touch its outputs
                    try:
                        r["accuracy"] = check(res, eager_res, mode, ref64)
                    except Exception as e:
                        r["accuracy"] = {"status": "ERROR", "fails": [short(e)]}
                del out, res
                est = float("inf")         # ms per step, the fastest warm-up step (sizes the timed blocks)
                for _ in range(a.warmup):
                    t0 = time.perf_counter()
                    step()
                    sync(dev)
                    est = min(est, (time.perf_counter() - t0) * 1e3)
                r["own_bytes"] = nbytes(list(model.parameters()) + list(model.buffers()))
                if s == "ember":
                    r["ember"] = ember.metrics.summary()
                model.zero_grad(set_to_none=True)
                live[s] = (step, model, est)
            except Exception as e:  # a compile failure or OOM in one backend must not stop the others
                r["error"] = short(e)
                model = f = step = out = res = None
                free(dev)
        eager_res = None
        cache.clear()
        free(dev)

        # timing: rounds, each running every live backend in turn
        times, peaks = collections.defaultdict(list), collections.defaultdict(int)
        for _ in range(a.rounds):
            for s, (step, model, est) in list(live.items()):
                n = a.iters or max(1, min(a.max_iters, int(a.block_s * 1e3 / max(est, 1e-3)) if est < 1e9 else 1))
                graphs = counters["stats"]["unique_graphs"]
                try:
                    ms, peak = timed_block(step, n, dev)
                except Exception as e:
                    rows[s]["error"] = "while timing: " + short(e)
                    del live[s]
                    free(dev)
                    continue
                finally:
                    model.zero_grad(set_to_none=True)
                rows[s]["recompiles"] = rows[s].get("recompiles", 0) + counters["stats"]["unique_graphs"] - graphs
                rows[s]["iters"] = n
                times[s].append(ms)
                if peak is not None:
                    peaks[s] = max(peaks[s], peak)
        for s, ts in times.items():
            rows[s]["ms"] = statistics.median(ts)
            rows[s]["ms_rounds"] = [round(t, 4) for t in ts]
            if dev == "cuda":
                rows[s]["peak_gib"] = (peaks[s] + rows[s]["own_bytes"] + static_bytes) / 2 ** 30
    except Exception as e:      # building the model or inputs (OOM, ...)
        for r in rows.values():
            r.setdefault("error", short(e))
    finally:
        live = init = inp = eager_res = None
        cache.clear()
        torch._dynamo.reset()
        free(dev)
    eager_ms = rows.get("eager", {}).get("ms")
    ind_ms = rows.get("inductor", {}).get("ms")
    for r in rows.values():
        if "ms" in r:
            r["speedup"] = eager_ms / r["ms"] if eager_ms else None
            r["vs_inductor"] = r["ms"] / ind_ms if ind_ms else None
    return list(rows.values())


# -- reporting -----------------------------------------------------------------------------------------------

def table(cells: list) -> str:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-".rjust(int(fmt.split(".")[0]))
    lines = ["ms = median time per step; speedup = eager ms / ms; vs inductor = ms / inductor ms (below 1: faster)",
             f"{'model':10}{'mode':7}{'backend':10}{'ms':>10}{'speedup':>9}{'compile s':>11}{'peak GiB':>10}"
             f"{'vs ind':>8}  accuracy"]
    shown = set()
    for r in cells:
        key = (r["model"], r["mode"])
        if "skipped" in r:
            if key not in shown:
                lines.append(f"{r['model']:10}{r['mode']:7}{'-':10}  skipped: {r['skipped']}")
            shown.add(key)
            continue
        if "error" in r and "ms" not in r:
            lines.append(f"{r['model']:10}{r['mode']:7}{r['backend']:10}  ERROR: {r['error'][:90]}")
            continue
        acc = "ref" if r["backend"] == "eager" else accuracy_cell(r.get("accuracy"))
        if r.get("ember", {}).get("eager_fallbacks"):
            acc += " (ran eagerly)"
        compile_s = None if r["backend"] == "eager" else r.get("first_step_s")
        lines.append(f"{r['model']:10}{r['mode']:7}{r['backend']:10}{r['ms']:10.3f}{num(r.get('speedup'), '8.2f')}x"
                     f"{num(compile_s, '11.1f')}{num(r.get('peak_gib'), '10.2f')}{num(r.get('vs_inductor'), '8.2f')}"
                     f"  {acc}")
    notes = []
    for r in cells:
        where = f"  {r['model']} {r['mode']} / {r['backend']}:"
        if "skipped" in r:
            continue
        if "error" in r:
            notes.append(f"{where} ERROR {r['error']}")
        acc = r.get("accuracy") or {}
        for fail in acc.get("fails", [])[:5]:
            notes.append(f"{where} {fail}")
        if acc.get("fp64_pass"):
            notes.append(f"{where} {acc['allclose']}/{acc['tensors']} allclose to eager, {acc['fp64_pass']} passed "
                         f"by the fp64 rule (worst: {acc['worst']}, RMSE x{acc['worst_rmse_ratio']:.2f} eager's)")
        if r.get("graph_breaks") or r.get("recompiles"):
            notes.append(f"{where} {r['graphs']} graph(s), {r['graph_breaks']} graph break(s) "
                         f"{r['graph_break_reasons']}, {r.get('recompiles', 0)} recompile(s) while timing")
        if "ember" in r:
            m = r["ember"]
            fb = ", ".join(f"{k} x{v}" for k, v in collections.Counter(m["fallbacks"]).most_common(6))
            notes.append(f"{where} {m['graphs_compiled']} graph(s), {m['generated_kernel_count']} kernels"
                         + (f", ATen fallbacks: {fb}" if fb else "")
                         + (f", {m['eager_fallbacks']} graph(s) RAN EAGERLY after an ember error"
                            if m["eager_fallbacks"] else ""))
    return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def versions() -> dict:
    v = {"torch": torch.__version__}
    for mod in ("triton", "transformers", "timm", "torchvision"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            v[mod] = None
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--backends", default="eager,inductor,ember")
    ap.add_argument("--small", action="store_true", help="tiny models and inputs (a CPU smoke test)")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed steps per backend per round (default: what fits --block-s)")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default 5 on GPU, 3 on CPU)")
    ap.add_argument("--block-s", type=float, default=0.25, help="time budget of one backend's steps in a round")
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=None, help="steps after the first, untimed (default 2 GPU, 1 CPU)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no model after this many seconds (default 540 on GPU, none on CPU; 0: none)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no GPU visible to torch; use --device cpu --small")
    a.rounds = a.rounds or (5 if a.device == "cuda" else 3)
    a.budget_s = a.budget_s if a.budget_s is not None else (540 if a.device == "cuda" else 0)
    a.warmup = a.warmup if a.warmup is not None else (2 if a.device == "cuda" else 1)
    specs = [s for s in a.backends.split(",") if s]
    if "eager" not in specs:
        specs.insert(0, "eager")     # the reference for accuracy and speed-up
    res = {"device": torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or "cpu",
           **versions(), "small": a.small, "args": vars(a), "cells": []}
    print(f"{res['device']}  " + "  ".join(f"{k} {res[k]}" for k in ("torch", "triton", "transformers", "timm",
                                                                      "torchvision")), flush=True)
    t_all = time.perf_counter()
    for name in [m for m in a.models.split(",") if m]:
        for mode in [m for m in a.modes.split(",") if m]:
            t0 = time.perf_counter()
            if a.budget_s and t0 - t_all > a.budget_s:
                rows = [{"model": name, "mode": mode, "backend": s,
                         "skipped": f"the run's time budget ({a.budget_s:.0f} s, --budget-s) is spent"} for s in specs]
            else:
                rows = run_group(name, mode, specs, a)
            res["cells"] += rows
            for r in rows:
                print(json.dumps(r), flush=True)
            print(f"# {name} {mode}: {time.perf_counter() - t0:.1f} s", flush=True)
            res["total_s"] = time.perf_counter() - t_all
            if a.json:           # after every model, so a run cut short still leaves its results
                with open(a.json, "w") as f:
                    json.dump(res, f, indent=1)
    print()
    print(table(res["cells"]))
    print(f"\ntotal {res['total_s']:.0f} s")
    bad = any("error" in r or (r.get("accuracy") or {}).get("status") in ("FAIL", "ERROR") for r in res["cells"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
