"""The Triton kernel backend: fused groups -> Triton kernels, on CUDA GPUs, or on CPUs through Triton's
interpreter (`ember.config.cpu_backend = "triton"`: the CPU test path of the Triton code)."""
from __future__ import annotations

import os
import types
from typing import Optional

import sympy

from ...config import config
from ...device import KernelBackend
from ...ir.symbolic import FloorDiv, hint
from ...runtime import compile_pool
from ...runtime.autotune import Autotuned, KernelTuning
from ...runtime.launch import Launcher
from ...runtime.template_choice import TemplateChoice, TemplateTuning
from ...runtime.loader import load_module, load_triton_file
from ...schedule.tiling import DEFAULT_TILING, choose_tiling
from ..generate import GeneratedKernel, generate_kernel, kernel_call_args, kernel_signature
from ..wrapper.lines import CallKernel, DefineKernel, Name
from ...ir.template import is_template
from .flex_launch import flex_attention_launches
from . import short_attention
from .combined import generate_combined
from .gemm_template import generate_template
from .product_choice import choose_products
from .spelling import module_header
from .heuristics import candidate_configs, row_sized_configs
from .kernel import TritonKernel



# Row-vector products ember's kernel beat cuBLAS on, on an H100 (experiments/skinny_gemm_probe.py --cold):
# N from 512 to 50257 columns, K up to 8 N (512 x 4096: 5.8 us against 6.7). Narrower or longer ones, where
# cuBLAS splits K over more programs than ember's columns make, keep cuBLAS.
MATVEC_MIN_N = 512
MATVEC_MAX_K_PER_N = 8


class TritonBackend(KernelBackend):
    file_extension = "py"
    # cuBLAS picks its fast kernels only when every leading dimension is a multiple of 16 bytes (a GEMM
    # over GPT-2's 50257-wide vocabulary otherwise runs several times slower: graph/passes/post_grad.py)
    matmul_alignment = 16
    # a long row is then read from memory once, not twice (once for the max, again for the sum)
    reads_rows_online = True
    tiling = DEFAULT_TILING
    gemm_templates = True
    element_arguments = True
    # one launch for many small independent pointwise kernels (codegen/triton/combined.py)
    combines_kernels = True

    def __init__(self, interpret: bool):
        self.interpreted = interpret
        self.name = "triton" if not interpret else "triton-interpret"
        self.device_type = "cpu" if interpret else "cuda"
        self.launches_on_current_device = not interpret
        # under autocast a bias needs a cast kernel of its own before the GEMM can add it; in the epilogue
        # of the pointwise kernel that reads the product the cast is free
        self.adds_matmul_bias_in_epilogue = not interpret
        # cuBLASLt's GELU and ReLU bias epilogues (under the interpreter ATen's CPU op runs them as two ops)
        self.library_bias_activations = frozenset() if interpret else frozenset({"relu", "gelu_tanh"})
        # cuDNN adds a bias in a separate elementwise pass; oneDNN (under the interpreter) fuses it
        self.adds_convolution_bias_in_epilogue = not interpret
        # cuDNN converts NCHW operands to NHWC and back around its fastest kernels; under the interpreter
        # the convolutions are oneDNN's, which prefers channels-last too (codegen/cpp/backend.py)
        self.channels_last_convolutions = True

    def reduction_split_rows(self, strided: bool) -> tuple[int, int]:
        # a program per long row, per XBLOCK (~64) columns of a strided reduction; 8192 partial rows fill a
        # large GPU even at XBLOCK 64. Row reductions over 1024 rows and more are not split: those rows
        # are already enough programs, and a split LayerNorm or softmax would read its input twice.
        return (4096, 8192) if strided else (1023, 8192)

    @property
    def tunes(self) -> bool:
        return config.autotune and not self.interpreted

    @property
    def precompiles(self) -> bool:
        """Record how each kernel will be launched (its WarmSpec), for the compile pool to build ahead."""
        return not self.interpreted

    def warm_up(self) -> None:
        # the zygote the compile workers fork from imports torch and Triton for seconds: it boots while
        # Dynamo and AOTAutograd trace
        if not self.interpreted:
            compile_pool.boot()

    def prepare(self) -> None:
        # the workers fork while AOTAutograd traces and partitions, not after the first kernel is generated
        if not self.interpreted:
            compile_pool.start()

    def runtime_row_copy_ahead(self, dtype, n, src_stride, dst_stride) -> None:
        if not self.interpreted:
            from ...runtime import row_copy
            row_copy.compile_ahead(dtype, n, src_stride, dst_stride)

    # -- code ---------------------------------------------------------------------------------------------

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        if not self.interpreted:
            compile_pool.start()        # workers boot while the rest of the graph is generated
        if any(is_template(n.buf) for n in group.nodes):
            return generate_template(self, name, group, graph, local)
        tiling = choose_tiling(group, self.tiling)
        k = generate_kernel(lambda materialize: TritonKernel(name, group, graph, local, materialize, tiling))
        meta = k.launch_config()
        args = kernel_call_args(k)
        source = k.source()
        stored = set(k.args.outputs)
        tuning = self._tuning(k, meta)
        warm = self._warm(graph, args, tuning.configs if tuning else [meta])
        define = DefineKernel(name, source, self, tuning, warm, group.device(), kernel_signature(k))
        elements = tuple(k.args.elements)
        if tuning:
            return GeneratedKernel(define, CallKernel(name, args, None, {}), stored, source, elements)
        xblock = meta["XBLOCK"]
        grid = [FloorDiv(k.X + xblock - 1, sympy.Integer(xblock))]
        if k.tiled:
            grid.append(FloorDiv(k.R + meta["RBLOCK"] - 1, sympy.Integer(meta["RBLOCK"])))
        return GeneratedKernel(define, CallKernel(name, args, grid, meta), stored, source, elements)

    def generate_combined(self, name, parts, graph) -> Optional[GeneratedKernel]:
        if not self.interpreted:
            compile_pool.start()
        return generate_combined(self, name, parts, graph)

    def _warm(self, graph, args, configs):
        if not self.precompiles:
            return None
        return compile_pool.WarmSpec([graph.get_dtype(a) if isinstance(a, Name) else hint(a) for a in args], configs)

    def _tuning(self, k, meta):
        written, read_back = k.args.written_positions()
        xnumel_arg = len(k.args.call_order()) + len(k.args.elements)
        if k.rblock_at_launch:
            # RBLOCK must cover the row the launch passes: the launcher picks the config per size class
            configs_for = row_sized_configs(k, self.tunes)
            return KernelTuning(configs_for(hint(k.X), hint(k.R)), xnumel_arg, k.tiled, written, configs_for,
                                read_back)
        if not self.tunes:
            return None
        configs = candidate_configs(k, meta)
        if len(configs) < 2:
            return None
        return KernelTuning(configs, xnumel_arg, k.tiled, written, read_back=read_back)

    def choose_products(self, specs, device):
        """{ProductSpec: the template's launch config, or None for the library call}, by timing each
        (gemm_templates="auto": codegen/triton/product_choice.py)."""
        return choose_products(specs, device, self.interpreted)

    def prefers_template(self, spec) -> bool:
        """Row-vector products (a decoding step's linear layers: one row of x times a weight read along K) on
        a GPU, wide enough for their programs to fill it and with K at most MATVEC_MAX_K_PER_N times N: there
        ember's row-vector kernel beat cuBLAS on every shape measured (codegen/triton/gemm_template.py),
        before any epilogue is fused into it."""
        if self.interpreted or spec.op == "bmm":
            return False
        _, m, n, k = spec.sizes()
        (_, b_stride) = spec.b
        return m == 1 and n >= MATVEC_MIN_N and 16 <= k <= MATVEC_MAX_K_PER_N * n and (b_stride[0] == 1 or k == 1)

    def flex_attention_launches(self, spec):
        """FlexAttention's kernels for one call (ir/kernel_call.py, FlexAttentionSpec): (the input buffers they
        read after the spec's, their Launches); Unsupported for what they do not cover."""
        return flex_attention_launches(spec, self.interpreted)

    def short_query_attention_launches(self, spec):
        """Attention with few queries per key/value head (ir/kernel_call.py, ShortQueryAttentionSpec): (the
        scratch results' (dtype, size), the Launches) (codegen/triton/short_attention.py)."""
        return short_attention.launches(spec, self.interpreted)

    def load(self, kernels) -> dict:
        if not kernels:
            return {}
        if self.interpreted:
            check_interpreter()
        source = module_header(self.interpreted) + "\n\n".join(k.source for k in kernels)
        mod = load_module(source, "ember_kernels", {"helpers": triton_helpers()})
        if self.interpreted:
            binaries = {}
        elif compile_pool.waits_at_first_launch() and config.fast_launch:
            # the launchers wait for the binaries (a launch without ember's launcher would compile them
            # itself while the workers do)
            binaries = compile_pool.precompile_ahead(mod, triton_helpers(), kernels)
        else:
            binaries = compile_pool.precompile(mod, triton_helpers(), kernels)
        return {k.name: self._loaded(mod, k, binaries.get(k.name)) for k in kernels}

    def _loaded(self, mod, k, binaries):
        fn = self._launchable(getattr(mod, k.name), binaries, k.warm.args if k.warm is not None else None)
        if isinstance(k.tuning, TemplateTuning):
            return TemplateChoice(fn, k.tuning, k.source)
        return Autotuned(fn, k.tuning, k.source) if k.tuning else fn

    def _launchable(self, fn, binaries=None, built_for=None):
        if self.interpreted or not config.fast_launch or is_interpreted(fn):
            return fn
        return Launcher(fn, binaries, built_for)


def triton_helpers() -> types.ModuleType:
    """ember.codegen.triton.helpers, loaded from its file as generated kernels are (so it follows the
    interpreter setting); the compile workers load it by its path."""
    return load_triton_file(os.path.join(os.path.dirname(__file__), "helpers.py"), "ember_helpers")


def check_interpreter() -> None:
    """Triton's interpreter works only if TRITON_INTERPRET=1 was set before triton was imported (its
    library functions are wrapped at import); say so plainly instead of failing inside a kernel."""
    import triton.language as tl
    if not is_interpreted(tl.standard.sum):
        raise RuntimeError(
            "ember runs Triton kernels for CPU tensors through the Triton interpreter, which needs "
            "TRITON_INTERPRET=1 in the environment before triton is imported. Set it when starting "
            "Python, import ember before anything imports triton, or use ember.config.cpu_backend='cpp'.")


def is_interpreted(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(fn, InterpretedFunction)
