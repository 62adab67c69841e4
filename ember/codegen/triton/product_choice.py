"""Choosing, before a graph is lowered, whether each of its matrix products runs as ember's GEMM template or
as the library call (ember.config.gemm_templates="auto", which `torch.compile(mode="max-autotune")` sets).

Each product (ir/template.py, ProductSpec) is timed on random operands of its exact sizes and strides:
- the template's plain product, once per launch config: a probe kernel holding the template's main loop
  (gemm_template.main_loop_lines) and a store;
- the ATen call the graph makes without templates (mm, bmm or addmm: cuBLAS).
The probe also runs the spec's sketched epilogue on its tile (the other inputs it loads, its costly
one-operand ops such as GELU's tanh), since on a GEMM's tile these run at the template's low occupancy
rather than hidden under a memory-bound kernel's traffic. The library call's time lacks its separate
epilogue kernel: that is counted as the kernel's traffic, timed as copies of a product-sized tensor: the
product's re-read and the output's write (`epilogue_share`), and a read of each full-size input (which the
probe's time holds for the template). Every sample is timed on the GPU alone (the stream sleeps while the
host queues it).

A product of a long K beside its output (ir/template.py, split_k_counts) is also timed decomposed along K,
for up to SPLIT_CANDIDATES split counts: the batched probe over K's slices storing float32 partials, plus a
sum of those partials (torch's, standing for ember's reduction kernel, which also runs the epilogue and so
reads its full-size inputs).

The fastest template or decomposition is chosen only when it is faster by more than MARGIN, and its fastest
config (with the split count: `decompose_k`) becomes the kernel's one config; otherwise the product is
lowered as the library call, exactly as with gemm_templates="never".

All probe configs of a graph are compiled at once in the compile pool. Choices are kept as JSON under
`<ember cache dir>/autotune/`, keyed by the spec, the GPU, the versions of torch (its cuBLAS) and Triton
and the TF32 setting, so a later compile of the same product times nothing. A probe config that fails to
compile or run is dropped with a debug log line; a product none of whose probes runs uses the library.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import types
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import _disable_current_modes

from ...config import config
from ...ir.template import SPLITS, ProductSpec, split_k_counts
from ...runtime import compile_pool
from ...runtime.autotune import median_ms, read_choice, write_choice
from ...runtime.launch import Launcher
from ...runtime.loader import cache_dir, load_module
from ...runtime.template_choice import max_programs, template_grid
from .gemm_template import is_row_vector, main_loop_lines, template_configs
from .spelling import UNARY, module_header, triton_type

log = logging.getLogger("ember")

# the template must beat the library (plus the epilogue it saves) by this fraction: a near-tie keeps the
# library call, whose speed does not depend on ember's timing being representative
MARGIN = 0.03
# decompositions along K: how many split counts are timed, within which multiples of the device's programs
# their tiles (128 x 128, over all slices) fall, and how many of the batched template's configs each
SPLIT_CANDIDATES = 3
SPLIT_WAVES = (0.25, 4)
SPLIT_CONFIGS = 4


def choose_products(specs: list, device: torch.device, interpreted: bool) -> dict:
    """{spec: the template's launch config, or None for the library call} for each spec."""
    choices, todo = {}, []
    for spec in dict.fromkeys(specs):
        stored = read_choice(_path(spec, device))
        if isinstance(stored, dict) and "template" in stored:
            choices[spec] = stored["template"]
        else:
            todo.append(spec)
    if todo:
        for spec, choice in _time_all(todo, device, interpreted).items():
            choices[spec] = choice
            write_choice(_path(spec, device), {"template": choice})
    return choices


def _path(spec: ProductSpec, device: torch.device) -> str:
    import triton
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    # the candidates' kinds (with decompositions along K) are part of the key: a choice made among fewer
    # candidates is timed again
    key = f"product|decompose_k={config.decompose_k}|{spec}|{name}|{torch.__version__}|{triton.__version__}"
    return os.path.join(cache_dir(), "autotune", hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


# -- probes ---------------------------------------------------------------------------------------------

# a sketched epilogue op -> its spelling on the probe's float32 tile `v` (ops not listed cost the probe nothing:
# additions and products are cheap beside the main loop)
_SKETCH_OPS = {"gelu": "helpers.erf_f32({0})", "gelu_tanh": "{0} / (1.0 + tl.exp(-2.0 * {0}))",
               "silu": "tl.sigmoid({0})", "erf": "helpers.erf_f32({0})",
               **{k: v for k, v in UNARY.items() if "libdevice" in v or "tl." in v}}


def probe_source(spec: ProductSpec, name: str, interpreted: bool, out_dtype: Optional[torch.dtype] = None) -> str:
    """A Triton kernel `name(A, B, C, E0, E1, ..., BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)` storing spec's
    product into a contiguous C (of `out_dtype`, else the operands' dtype), with the template's main loop and
    then its sketched epilogue on the tile: a load of each E (the product's size, or a row of N broadcast)
    and the costly one-operand ops."""
    batch, m, n, k = spec.sizes()
    int64 = max(_extent(spec.a), _extent(spec.b), batch * m * n) >= 2 ** 31
    even_k = all(k % cfg["BLOCK_K"] == 0 for cfg in template_configs(spec.sizes(), spec.dtype, interpreted,
                                                                       spec.op == "bmm"))
    main = main_loop_lines(spec.sizes(), spec.op == "bmm", spec.dtype, ("A", 0, _strides(spec.a)),
                           ("B", 0, _strides(spec.b)), int64, even_k, interpreted, spec.tf32)
    lines = main.tile + ["v = acc"]
    loads = _loads(spec)
    for i, token in enumerate(loads):
        index = "xindex" if token == "load_full" else f"(xindex % {n})"
        lines.append(f"v += tl.load(E{i} + {index}, xmask, other=0).to(tl.float32)")
    lines += [f"v = {_SKETCH_OPS[t].format('v')}" for t in spec.epilogue if t in _SKETCH_OPS]
    lines.append(f"tl.store(C + xindex, v.to({triton_type(out_dtype or spec.dtype)}), xmask)")
    params = ["A", "B", "C"] + [f"E{i}" for i in range(len(loads))] + \
        [f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
    head = ["@triton.jit", f"def {name}({', '.join(params)}):"]
    return "\n".join(head + ["    " + ln for ln in main.around(lines)]) + "\n"


def load_probes(source: str):
    """The module of probe kernels, with the helpers generated kernels call (erf)."""
    from .backend import triton_helpers
    return load_module(source, "ember_probes", {"helpers": triton_helpers()})


def _loads(spec: ProductSpec) -> list:
    return [t for t in spec.epilogue if t.startswith("load_")]


def _epilogue_inputs(spec: ProductSpec, device) -> list:
    batch, m, n, _ = spec.sizes()
    return [torch.randn(batch * m * n if t == "load_full" else n, device=device).to(spec.dtype)
            for t in _loads(spec)]


def _strides(operand) -> list:
    """(batch, row, col) strides, 0 along dims of size 1 (as the template reads them)."""
    size, stride = operand
    s = [st if n != 1 else 0 for st, n in zip(stride, size)]
    return [0] + s if len(s) == 2 else s


def _extent(operand) -> int:
    size, stride = operand
    return 1 + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else 0


def _operand(operand, dtype, device) -> torch.Tensor:
    size, stride = operand
    base = torch.randn(max(_extent(operand), 1), device=device).to(dtype) * 0.1
    return base.as_strided(size, stride)


@dataclasses.dataclass
class _Probe:
    """One probe kernel to time: the product it computes (`spec`), in which dtype it stores it, its configs;
    `splits` where it is the batched product of a decomposition along K."""
    spec: ProductSpec
    name: str
    out_dtype: torch.dtype
    configs: list
    splits: int = 0


def _probes(spec: ProductSpec, index: int, interpreted: bool, device: torch.device) -> list:
    """The spec's own probe, and one per decomposition along K worth timing."""
    probes = [_Probe(spec, f"ember_probe_{index}", spec.dtype,
                     template_configs(spec.sizes(), spec.dtype, interpreted, spec.op == "bmm"))]
    for splits in _split_counts(spec, device):
        split = split_spec(spec, splits)
        probes.append(_Probe(split, f"ember_probe_{index}_k{splits}", torch.float32,
                             template_configs(split.sizes(), spec.dtype, interpreted, True)[:SPLIT_CONFIGS], splits))
    return probes


def _split_counts(spec: ProductSpec, device: torch.device) -> list:
    """K's split counts to time for spec: those giving between SPLIT_WAVES[0] and SPLIT_WAVES[1] of the
    device's programs in 128 x 128 tiles, at most SPLIT_CANDIDATES of them, the most splits first."""
    if config.decompose_k != "auto" or spec.op == "bmm":
        return []
    _, m, n, k = spec.sizes()
    tiles, programs = -(-m // 128) * -(-n // 128), max_programs(device)
    counts = [s for s in split_k_counts(m, n, k)
              if SPLIT_WAVES[0] * programs <= s * tiles <= SPLIT_WAVES[1] * programs]
    return counts[::-1][:SPLIT_CANDIDATES]


def split_spec(spec: ProductSpec, splits: int) -> ProductSpec:
    """The batched product of spec decomposed into `splits` slices of K (ir/template.py, split_k_views)."""
    (asz, (sam, sak)), (bsz, (sbk, sbn)) = spec.a, spec.b
    depth = asz[1] // splits
    return ProductSpec("bmm", ((splits, asz[0], depth), (depth * sak, sam, sak)),
                       ((splits, depth, bsz[1]), (depth * sbk, sbk, sbn)), None, spec.dtype, 0.0)


def _time_all(specs: list, device: torch.device, interpreted: bool) -> dict:
    probes = [_probes(s, i, interpreted, device) for i, s in enumerate(specs)]
    flat = [p for ps in probes for p in ps]
    source = module_header(interpreted) + \
        "\n\n".join(probe_source(p.spec, p.name, interpreted, p.out_dtype) for p in flat)
    mod = load_probes(source)
    if not interpreted:
        kernels = [types.SimpleNamespace(name=p.name, warm=compile_pool.WarmSpec(
            [p.spec.dtype] * 2 + [p.out_dtype] + [p.spec.dtype] * len(_loads(p.spec)), p.configs)) for p in flat]
        compile_pool.precompile(mod, mod.helpers, kernels)
    out = {}
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with unset_fake_temporarily(), _disable_current_modes(), on_device:
        for spec, ps in zip(specs, probes):
            launchers = [getattr(mod, p.name) if interpreted else Launcher(getattr(mod, p.name)) for p in ps]
            out[spec] = _choose(spec, list(zip(ps, launchers)), device)
    return out


def _time_configs(probe: _Probe, launcher, device: torch.device, extra: tuple = ()) -> list:
    """(ms, config) for each of the probe's configs that runs; operands random, of the spec's strides."""
    spec = probe.spec
    batch, m, n, _ = spec.sizes()
    a, b = _operand(spec.a, spec.dtype, device), _operand(spec.b, spec.dtype, device)
    c = torch.empty((batch, m, n) if spec.op == "bmm" else (m, n), dtype=probe.out_dtype, device=device)
    args = (a, b, c, *extra)
    programs = max_programs(device)
    persistent = not is_row_vector(spec.sizes(), spec.op == "bmm")
    timed = []
    for cfg in probe.configs:
        grid = template_grid(spec.sizes(), cfg, programs, persistent)
        launch = (lambda g=grid, cfg=cfg: launcher.launch(g, args, cfg)) if isinstance(launcher, Launcher) \
            else (lambda g=grid, cfg=cfg: launcher[g](*args, **cfg))
        try:
            timed.append((median_ms(launch, gpu_only=True), cfg))
        except Exception as e:        # noqa: BLE001 - a config that fails is only dropped
            log.debug("ember product choice: %s config %s dropped: %s", spec, cfg, e)
    return timed


def _choose(spec: ProductSpec, probes: list, device: torch.device) -> Optional[dict]:
    """The choice for spec from its probes ((probe, launcher) pairs, its own first): the fastest template or
    decomposition along K if it beats the library call plus the epilogue kernel fusing saves, else None."""
    batch, m, n, k = spec.sizes()
    (own, launcher), splits = probes[0], probes[1:]
    templates = _time_configs(own, launcher, device, tuple(_epilogue_inputs(spec, device)))
    a, b = _operand(spec.a, spec.dtype, device), _operand(spec.b, spec.dtype, device)
    library = median_ms(_library_call(spec, a, b, device), gpu_only=True)
    full_loads = sum(t == "load_full" for t in spec.epilogue)
    copy_ms = 0.0
    if spec.epilogue_share or (splits and full_loads):
        # a product-sized copy: each read or write of the product's size is half of one
        c = torch.empty((batch, m, n) if spec.op == "bmm" else (m, n), dtype=spec.dtype, device=device)
        copy_dst = torch.empty_like(c)
        copy_ms = median_ms(lambda: copy_dst.copy_(c), gpu_only=True)
    for probe, split_launcher in splits:
        # the partials' sum: a reduction kernel that also runs the epilogue, reading its full-size inputs
        partials, summed = torch.randn(probe.splits, m, n, device=device), torch.empty(m, n, device=device)
        reduce_ms = median_ms(lambda p=partials: torch.sum(p, 0, out=summed), gpu_only=True) + \
            0.5 * full_loads * copy_ms
        templates += [(ms + reduce_ms, {**cfg, SPLITS: probe.splits})
                      for ms, cfg in _time_configs(probe, split_launcher, device)]
    # the library's epilogue kernel: the product's re-read and the output's write (less where the product is
    # stored anyway), and a read of each full-size input
    saved = (spec.epilogue_share + 0.5 * full_loads) * copy_ms if spec.epilogue_share else 0.0
    choice = decide(templates, library, saved)
    log.debug("ember product choice: %s: library %.4f ms (+%.4f saved by fusing), template %s -> %s", spec,
              library, saved, [(round(t, 4), cfg) for t, cfg in templates], "library" if choice is None else choice)
    return choice


def decide(templates: list, library_ms: float, saved_ms: float) -> Optional[dict]:
    """The fastest template config if it beats the library call plus the epilogue time a fused epilogue
    saves by more than MARGIN; else None (the library). `templates`: (ms, config) of the configs that ran."""
    if not templates:
        return None
    ms, cfg = min(templates, key=lambda tc: tc[0])
    return cfg if ms < (library_ms + saved_ms) * (1 - MARGIN) else None


def _library_call(spec: ProductSpec, a, b, device):
    if spec.op == "conv1x1":        # the convolution library, on the 4-D tensors
        x, w = (_operand(operand, spec.dtype, device) for operand in spec.conv)
        bias = None if spec.bias is None else _operand(spec.bias, spec.dtype, device)
        return lambda: torch.convolution(x, w, bias, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    if spec.op == "addmm":
        bias = _operand(spec.bias, spec.dtype, device)
        return lambda: torch.addmm(bias, a, b)
    product = torch.bmm if spec.op == "bmm" else torch.mm
    return lambda: product(a, b)
