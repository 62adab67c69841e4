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
probe's time holds for the template). Every sample is timed on the GPU alone
(the stream sleeps while the host queues it). The template is chosen only when it is faster by more than
MARGIN, and its fastest config becomes the kernel's one config; otherwise the product is lowered as the
library call, exactly as with gemm_templates="never".

All probe configs of a graph are compiled at once in the compile pool. Choices are kept as JSON under
`<ember cache dir>/autotune/`, keyed by the spec, the GPU, the versions of torch (its cuBLAS) and Triton
and the TF32 setting, so a later compile of the same product times nothing. A probe config that fails to
compile or run is dropped with a debug log line; a product none of whose probes runs uses the library.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import types
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import _disable_current_modes

from ...ir.template import ProductSpec
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
    key = f"product|{spec}|{name}|{torch.__version__}|{triton.__version__}|" \
          f"{torch.backends.cuda.matmul.allow_tf32}"
    return os.path.join(cache_dir(), "autotune", hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


# -- probes ---------------------------------------------------------------------------------------------

# a sketched epilogue op -> its spelling on the probe's float32 tile `v` (ops not listed cost the probe nothing:
# additions and products are cheap beside the main loop)
_SKETCH_OPS = {"gelu": "helpers.erf_f32({0})", "gelu_tanh": "{0} / (1.0 + tl.exp(-2.0 * {0}))",
               "silu": "tl.sigmoid({0})", "erf": "helpers.erf_f32({0})",
               **{k: v for k, v in UNARY.items() if "libdevice" in v or "tl." in v}}


def probe_source(spec: ProductSpec, name: str, interpreted: bool) -> str:
    """A Triton kernel `name(A, B, C, E0, E1, ..., BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)` storing spec's
    product into a contiguous C, with the template's main loop and then its sketched epilogue on the tile:
    a load of each E (the product's size, or a row of N broadcast) and the costly one-operand ops."""
    batch, m, n, k = spec.sizes()
    int64 = max(_extent(spec.a), _extent(spec.b), batch * m * n) >= 2 ** 31
    even_k = all(k % cfg["BLOCK_K"] == 0 for cfg in template_configs(spec.sizes(), spec.dtype, interpreted,
                                                                       spec.op == "bmm"))
    main = main_loop_lines(spec.sizes(), spec.op == "bmm", spec.dtype, ("A", 0, _strides(spec.a)),
                           ("B", 0, _strides(spec.b)), int64, even_k, interpreted)
    lines = main.tile + ["v = acc"]
    loads = _loads(spec)
    for i, token in enumerate(loads):
        index = "xindex" if token == "load_full" else f"(xindex % {n})"
        lines.append(f"v += tl.load(E{i} + {index}, xmask, other=0).to(tl.float32)")
    lines += [f"v = {_SKETCH_OPS[t].format('v')}" for t in spec.epilogue if t in _SKETCH_OPS]
    lines.append(f"tl.store(C + xindex, v.to({triton_type(spec.dtype)}), xmask)")
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


def _time_all(specs: list, device: torch.device, interpreted: bool) -> dict:
    names = [f"ember_probe_{i}" for i in range(len(specs))]
    configs = [template_configs(s.sizes(), s.dtype, interpreted, s.op == "bmm") for s in specs]
    source = module_header(interpreted) + \
        "\n\n".join(probe_source(s, name, interpreted) for s, name in zip(specs, names))
    mod = load_probes(source)
    if not interpreted:
        kernels = [types.SimpleNamespace(name=name, warm=compile_pool.WarmSpec([s.dtype] * (3 + len(_loads(s))), cfgs))
                   for s, name, cfgs in zip(specs, names, configs)]
        compile_pool.precompile(mod, mod.helpers, kernels)
    out = {}
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with unset_fake_temporarily(), _disable_current_modes(), on_device:
        for spec, name, cfgs in zip(specs, names, configs):
            fn = getattr(mod, name)
            out[spec] = _choose(spec, fn if interpreted else Launcher(fn), cfgs, device)
    return out


def _choose(spec: ProductSpec, probe, configs: list, device: torch.device) -> Optional[dict]:
    batch, m, n, k = spec.sizes()
    a, b = _operand(spec.a, spec.dtype, device), _operand(spec.b, spec.dtype, device)
    c = torch.empty((batch, m, n) if spec.op == "bmm" else (m, n), dtype=spec.dtype, device=device)
    args = (a, b, c, *_epilogue_inputs(spec, device))
    templates = []
    programs = max_programs(device)
    persistent = not is_row_vector(spec.sizes(), spec.op == "bmm")
    for cfg in configs:
        grid = template_grid(spec.sizes(), cfg, programs, persistent)
        launch = (lambda g=grid, cfg=cfg: probe.launch(g, args, cfg)) if isinstance(probe, Launcher) \
            else (lambda g=grid, cfg=cfg: probe[g](*args, **cfg))
        try:
            templates.append((median_ms(launch, gpu_only=True), cfg))
        except Exception as e:        # noqa: BLE001 - a config that fails is only dropped
            log.debug("ember product choice: %s config %s dropped: %s", spec, cfg, e)
    library = median_ms(_library_call(spec, a, b, device), gpu_only=True)
    saved = 0.0
    if spec.epilogue_share:
        # the library's epilogue kernel: the product's re-read and the output's write (less where the product
        # is stored anyway), and a read of each full-size input; each read or write is half a copy
        copy_src, copy_dst = torch.empty_like(c), torch.empty_like(c)
        full_loads = sum(t == "load_full" for t in spec.epilogue)
        copy_ms = median_ms(lambda: copy_dst.copy_(copy_src), gpu_only=True)
        saved = (spec.epilogue_share + 0.5 * full_loads) * copy_ms
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
    if spec.op == "addmm":
        bias = _operand(spec.bias, spec.dtype, device)
        return lambda: torch.addmm(bias, a, b)
    product = torch.bmm if spec.op == "bmm" else torch.mm
    return lambda: product(a, b)
