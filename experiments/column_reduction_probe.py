"""Column (strided-dim) reductions: ember's kernel time under several launch-config variants (the current
heuristics, persistent rows without the column cap, and looped kernels with one forced config each), on a
CUDA GPU. Run from the repository root:
    python -m experiments.column_reduction_probe            # every variant, each in its own process
    python -m experiments.column_reduction_probe main       # the current heuristics only
"""
import json, os, subprocess, sys, tempfile
import torch

CASES = {
    "sum0_f32_8k": (lambda x: x.sum(0), lambda: (torch.randn(8192, 8192, device="cuda"),)),
    "sum0_f32_4k": (lambda x: x.sum(0), lambda: (torch.randn(4096, 4096, device="cuda"),)),
    "sum0_bf16_32kx1k": (lambda x: x.float().sum(0), lambda: (torch.randn(32768, 1024, device="cuda", dtype=torch.bfloat16),)),
    "wgrad_bf16_16kx4k": (lambda d, x: (d.float() * x.float()).sum(0), lambda: tuple(torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))),
    "wgrad_bf16_4kx768": (lambda d, x: (d.float() * x.float()).sum(0), lambda: tuple(torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))),
    "colsoftmax_f32_4k": (lambda x: torch.softmax(x, 0), lambda: (torch.randn(4096, 4096, device="cuda"),)),
    "colsoftmax_f32_8k": (lambda x: torch.softmax(x, 0), lambda: (torch.randn(8192, 8192, device="cuda"),)),
}
LOOPED = [(64, 32, 8), (32, 64, 4), (32, 128, 8), (32, 256, 8), (16, 256, 8), (64, 64, 8), (32, 128, 4), (64, 128, 8), (128, 32, 8), (16, 128, 4)]
VARIANTS = ["main", "nocap"] + [f"loop{c}" for c in LOOPED]


def one(variant):
    import ember
    from ember.codegen.triton import heuristics as H
    from benchmarks.kernels import device_ms
    if variant == "nocap":
        H.PERSISTENT_COLUMN_BLOCK_MAX = 1 << 30
    elif variant.startswith("loop"):
        xb, rb, w = eval(variant[4:])
        H.persistent_row_limit = lambda k, limit: 1
        orig = H.launch_config
        H.launch_config = lambda k: ({"XBLOCK": xb, "RBLOCK": rb, "num_warps": w} if k.has_rdim and not k.persistent and not k.tiled else orig(k))
        ember.config.autotune = False
    res = {}
    for name, (fn, mk) in CASES.items():
        torch._dynamo.reset()
        args = mk()
        try:
            f = torch.compile(fn, backend="ember")
            out = f(*args)
            ref = fn(*args)
            ok = torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * max(1.0, ref.float().abs().max().item() * 1e-3))
            ms = device_ms(lambda: f(*args), calls=30)
            nb = sum(a.numel() * a.element_size() for a in args) + out.numel() * out.element_size()
            res[name] = {"ms": ms, "GBps": nb / ms / 1e6, "ok": bool(ok)}
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:150]}"}
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1]); sys.exit(0)
    x = torch.empty(2 ** 29, device="cuda"); y = torch.empty_like(x)
    from benchmarks.kernels import device_ms
    roof = 2 * x.numel() * 4 / device_ms(lambda: y.copy_(x)) / 1e6
    del x, y
    print(f"copy {roof:.0f} GB/s")
    table = {}
    for v in VARIANTS:
        env = dict(os.environ, EMBER_CACHE_DIR=tempfile.mkdtemp(prefix="emc"))
        p = subprocess.run([sys.executable, "-m", "experiments.column_reduction_probe", v], capture_output=True,
                           text=True, env=env, timeout=200, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        table[v] = json.loads(line[-1][7:]) if line else {"error": p.stderr[-300:]}
        print(v, json.dumps(table[v]), flush=True)
    print(f"\n{'variant':16}" + "".join(f"{c[:18]:>20}" for c in CASES))
    for v, r in table.items():
        cells = []
        for c in CASES:
            x = r.get(c, {})
            cells.append(f"{'ERR':>20}" if "ms" not in x else f"{x['ms']:8.3f} {100 * x['GBps'] / roof:4.0f}%{'' if x['ok'] else '!'}     ")
        print(f"{v:16}" + "".join(cells))
