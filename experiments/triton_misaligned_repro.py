"""A Triton fault, standalone: ember's ConvNeXt LayerNorm-gradient kernel run with each launch
config in its own process (a CUDA fault ends the process that hits it). On an H100 with Triton 3.6 the
config (XBLOCK 64, RBLOCK 32, 8 warps) faults with "misaligned address"; the others run and match
torch. Variants: xcontig3 reads in_ptr3 along xindex like the other loads, no_load3 drops it, fp32_load3
makes it float32. heuristics.FAULTING_COLUMN_CONFIG keeps ember off that config; rerun this on a newer Triton to
see whether the guard can go.

    python -m experiments.triton_misaligned_repro          # needs a CUDA GPU
"""
import os, subprocess, sys, tempfile, importlib.util
KERNEL = '''
@triton.jit
def kernel161(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, out_ptr0, out_ptr1, out_ptr2, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    rbase = tl.arange(0, RBLOCK)[None, :]
    _acc3 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    _acc13 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    _acc15 = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < rnumel
        tmp0 = tl.load(in_ptr1 + (96*rindex + xindex), xmask & rmask, other=0)
        tmp1 = tl.load(in_ptr0 + (96*rindex + xindex), xmask & rmask, other=0).to(tl.float32)
        tmp2 = (tmp0 * tmp1)
        _acc3 = _acc3 + tl.where(xmask & rmask, tmp2, 0)
        tmp5 = tl.load(in_ptr2 + (96*rindex + xindex), xmask & rmask, other=0).to(tl.float32)
        tmp6 = (tmp0 + tmp5)
        tmp7 = tl.load(in_ptr3 + (3136*xindex + 301056*(rindex // 3136) + (rindex % 3136)), xmask & rmask, other=0).to(tl.float32)
        tmp8 = tl.load(in_ptr4 + (rindex), xmask & rmask, other=0)
        tmp9 = (tmp7 - tmp8)
        tmp10 = tl.load(in_ptr5 + (rindex), xmask & rmask, other=0)
        tmp11 = (tmp9 * tmp10)
        tmp12 = (tmp6 * tmp11)
        _acc13 = _acc13 + tl.where(xmask & rmask, tmp12, 0)
        _acc15 = _acc15 + tl.where(xmask & rmask, tmp6, 0)
    tmp4 = tl.sum(_acc3, 1)[:, None]
    tl.store(out_ptr0 + (xindex), tmp4, xmask)
    tmp14 = tl.sum(_acc13, 1)[:, None]
    tl.store(out_ptr1 + (xindex), tmp14, xmask)
    tmp16 = tl.sum(_acc15, 1)[:, None]
    tl.store(out_ptr2 + (xindex), tmp16, xmask)
'''

# the faulting config first, then heuristics.LOOPED_COLUMN_CONFIGS (what ember launches),
# then the earlier candidates
CFGS = [(64, 32, 8), (16, 256, 8), (32, 256, 8), (32, 128, 8), (8, 512, 8), (16, 128, 4), (64, 64, 8),
        (128, 16, 8), (32, 64, 4), (128, 32, 8), (256, 8, 8), (8, 64, 4), (16, 16, 4)]
IDX3 = "3136*xindex + 301056*(rindex // 3136) + (rindex % 3136)"
VARIANTS = {"orig": lambda s: s,
            "xcontig3": lambda s: s.replace(IDX3, "96*rindex + xindex"),
            "no_load3": lambda s: s.replace(f"tl.load(in_ptr3 + ({IDX3}), xmask & rmask, other=0).to(tl.float32)", "0.0"),
            "fp32_load3": lambda s: s}

def child(variant, ci):
    import torch, triton, triton.language as tl
    src = VARIANTS[variant](KERNEL)
    hdr = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"
    d = tempfile.mkdtemp(); p = os.path.join(d, f"k_{variant}.py"); open(p, "w").write(hdr + src)
    spec = importlib.util.spec_from_file_location("kmod", p); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    dev = "cuda"; bf = torch.bfloat16; f = torch.float32
    conv_dtype = f if variant == "fp32_load3" else bf
    a = [torch.randn(50176 * 96, device=dev, dtype=bf), torch.randn(50176 * 96, device=dev, dtype=f),
         torch.randn(50176 * 96, device=dev, dtype=bf), torch.randn(16 * 96 * 3136, device=dev, dtype=conv_dtype),
         torch.randn(50176, device=dev, dtype=f), torch.randn(50176, device=dev, dtype=f)]
    outs = [torch.empty(96, device=dev, dtype=f) for _ in range(3)]
    X, R, W = CFGS[ci]
    m.kernel161[(triton.cdiv(96, X),)](*a, *outs, 96, 50176, XBLOCK=X, RBLOCK=R, num_warps=W)
    torch.cuda.synchronize()
    # reference for acc3: sum over r of in1*in0
    ref = (a[1].view(50176, 96) * a[0].view(50176, 96).float()).sum(0)
    print("maxdiff", (outs[0] - ref).abs().max().item())

if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1], int(sys.argv[2])); sys.exit(0)
    if not __import__("torch").cuda.is_available():
        sys.exit("this repro needs a CUDA GPU")
    for v in VARIANTS:
        for ci in range(len(CFGS)):
            r = subprocess.run([sys.executable, __file__, v, str(ci)], capture_output=True, text=True, timeout=120)
            tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            print(f"{v:10s} {CFGS[ci]}  rc={r.returncode}  {tail[0][:150]}", flush=True)
