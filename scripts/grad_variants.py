"""Which ember setting changes a model's training gradients? Compares each variant's gradients with a
float64 reference, as a multiple of eager bf16-autocast's own error (benchmarks/models.py's small models).

    python scripts/grad_variants.py bert,gpt2 cuda      # or cpu
"""
import copy
import os
import sys

import torch

import ember
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import models as M
dev = sys.argv[2] if len(sys.argv) > 2 else "cuda"
def grads(model, inp, amp, dtype=None):
    M.run_step(model, inp, "train", dev, amp=amp)
    return {n.replace("_orig_mod.", ""): p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
import ember.codegen.program as P
orig = P.can_overwrite
variants = {"default": {}, "fuse_off": dict(fuse=False), "hfuse_off": dict(horizontal_fusion=False),
            "autotune_off": dict(autotune=False), "inplace_off": "inplace", "persist_max_1": dict(persistent_reduction_max=1)}
for name in sys.argv[1].split(","):
    torch.manual_seed(0)
    base, n_out = M.build(name, True)
    inp = M.make_inputs(name, "train", True, n_out, dev)
    m64 = copy.deepcopy(base).double().to(dev)
    g64 = grads(m64, inp, amp=False)
    ge = grads(copy.deepcopy(base).to(dev), inp, amp=True)
    for vname, v in variants.items():
        torch._dynamo.reset()
        P.can_overwrite = (lambda *a: False) if v == "inplace" else orig
        with ember.config.patch(**(v if isinstance(v, dict) else {})):
            m = torch.compile(copy.deepcopy(base).to(dev), backend="ember")
            gc = grads(m, inp, amp=True)
        worst = max(((M.rmse(gc[k], g64[k]) / max(M.rmse(ge[k], g64[k]), 1e-12), k) for k in g64))
        bad = sum(M.rmse(gc[k], g64[k]) > 3 * M.rmse(ge[k], g64[k]) + 1e-9 for k in g64)
        print(f"{name:6} {vname:14} worst x{worst[0]:9.2f} ({worst[1]})  bad {bad}/{len(g64)}", flush=True)
    P.can_overwrite = orig
