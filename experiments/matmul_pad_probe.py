"""Does zero-padding a misaligned bf16 matmul change its accuracy on this GPU? GPT-2's LM head shapes
(50257 classes, 768 features, 4096 tokens): each product unpadded and padded to 8 elements, relative RMSE
against float64, with torch's bf16 reduced-precision-reduction switch on (torch's default) and off, and the
cuBLAS kernel each one ran. Needs a CUDA GPU:
    python -m experiments.matmul_pad_probe"""
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench


def rel_rmse(a, ref):
    return ((a.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def kernels(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return ",".join(sorted({e.key[:60] for e in p.key_averages() if e.device_type.name == "CUDA"}))


def main():
    T, H, V = 4096, 768, 50257
    torch.manual_seed(0)
    g = (torch.randn(T, V, device="cuda") * 1e-3).bfloat16()      # a logits gradient
    w = (torch.randn(V, H, device="cuda") * 0.02).bfloat16()      # the LM head's weight
    h = torch.randn(T, H, device="cuda").bfloat16()               # the final hidden states
    cases = {"grad_h = g @ w   (K = V)": (g, w), "grad_w = g.T @ h (M = V)": (g.t(), h),
             "logits = h @ w.T (N = V)": (h, w.t())}
    pad = -V % 8
    padded = {"grad_h = g @ w   (K = V)": (F.pad(g, (0, pad)), F.pad(w, (0, 0, 0, pad))),
              "grad_w = g.T @ h (M = V)": (F.pad(g.t(), (0, 0, 0, pad)), h),
              "logits = h @ w.T (N = V)": (h, F.pad(w.t(), (0, pad)))}
    # the same, each operand padded in its own storage order (a padded base, transposed back)
    stored = {"grad_h = g @ w   (K = V)": padded["grad_h = g @ w   (K = V)"],
              "grad_w = g.T @ h (M = V)": (F.pad(g, (0, pad)).t(), h),
              "logits = h @ w.T (N = V)": (h, F.pad(w, (0, 0, 0, pad)).t())}
    for name, (a, b) in cases.items():
        ref = a.double() @ b.double()
        pa, pb = padded[name]
        for reduced in (True, False):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
            plain = a @ b
            pad_out = (pa @ pb)[:ref.shape[0], :ref.shape[1]]
            print(f"{name} reduced={reduced!s:5}  plain {rel_rmse(plain, ref):.3e}  padded "
                  f"{rel_rmse(pad_out, ref):.3e}", flush=True)
            print(f"    plain:  {kernels(lambda: a @ b)}\n    padded: {kernels(lambda: pa @ pb)}", flush=True)
        sa, sb = stored[name]
        us = [do_bench(lambda: x @ y) * 1e3 for x, y in ((a, b), (pa, pb), (sa, sb))]
        print(f"    us: plain {us[0]:.0f}  padded (contiguous copies) {us[1]:.0f}  padded in storage order "
              f"{us[2]:.0f}   {kernels(lambda: sa @ sb)}", flush=True)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    # a returned logits product must come out dense: the padded product and a dense copy of it, against
    # ember::padded_mm's row chunks (one chunk-sized buffer instead of a whole padded product)
    import ember  # noqa: F401  (registers ember::padded_mm)
    from ember.graph.custom_ops import padded_mm
    from ember.runtime.row_copy import copy_rows
    wp = F.pad(w, (0, 0, 0, pad)).t()
    full = h @ wp
    dense = torch.empty(T, V, device="cuda", dtype=h.dtype)
    for label, fn in (("padded product + dense copy", lambda: (h @ wp)[:, :V].contiguous()),
                      ("the padded product alone", lambda: h @ wp),
                      ("ATen's copy of it", lambda: dense.copy_(full[:, :V])),
                      ("ember's row copy of it", lambda: copy_rows(dense, full[:, :V])),
                      ("ember::padded_mm (row chunks)", lambda: padded_mm(h, wp, None, T, V)),
                      ("unpadded", lambda: h @ w.t())):
        us = do_bench(fn) * 1e3
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"returned logits, {label:32} {us:7.0f} us  peak {peak:6.0f} MiB", flush=True)
    assert (padded_mm(h, wp, None, T, V) - (h @ wp)[:, :V]).abs().max().item() == 0
    from ember.graph import custom_ops as ops
    for mb in (32, 64, 128, 256):
        ops.PADDED_MM_CHUNK_BYTES = mb << 20
        print(f"ember::padded_mm with {mb:3} MB chunks: {do_bench(lambda: padded_mm(h, wp, None, T, V)) * 1e3:6.0f} us")


if __name__ == "__main__":
    main()
