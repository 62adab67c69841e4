"""Kernel backends, chosen by device: Triton on GPUs; on CPUs the backend `config.cpu_backend` names
(C++/OpenMP by default, or Triton through its interpreter for tests). This is the one place that
decides; nothing outside codegen/ asks which backend is in use."""
from __future__ import annotations

import dataclasses

import sympy
import torch

from .. import config
from ..ir.symbolic import FloorDiv
from ..ir.symbolic import hint
from ..runtime import compile_pool
from ..runtime.autotune import KernelTuning
from .wrapper.lines import CallKernel, DefineKernel, Name


@dataclasses.dataclass
class GeneratedKernel:
    define: DefineKernel
    call: CallKernel
    stored: set           # buffer names the kernel writes to memory
    source: str


class TritonBackend:
    def __init__(self, interpret: bool):
        self.name = "triton-interpret" if interpret else "triton"
        self.tunes = config.autotune and not interpret
        self.precompiles = not interpret
        if self.precompiles:
            compile_pool.start()        # workers boot while the graph is lowered and scheduled

    def generate(self, name, group, graph, local) -> GeneratedKernel:
        from ..schedule.tiling import choose_tiling
        from .triton.kernel import TritonKernel
        tiling = choose_tiling(group)
        k = generate_kernel(lambda materialize: TritonKernel(name, group, graph, local, materialize, tiling))
        meta = k.launch_config()
        args = kernel_call_args(k)
        source = k.source()
        stored = set(k.args.outputs)
        tuning = self._tuning(k, meta)
        warm = self._warm(graph, args, tuning.configs if tuning else [meta])
        if tuning:
            return GeneratedKernel(DefineKernel(name, source, self.name, tuning, warm, group.device()),
                                   CallKernel(name, args, None, {}), stored, source)
        xblock = meta["XBLOCK"]
        grid = [FloorDiv(k.X + xblock - 1, sympy.Integer(xblock))]
        if k.tiled:
            grid.append(FloorDiv(k.R + meta["RBLOCK"] - 1, sympy.Integer(meta["RBLOCK"])))
        return GeneratedKernel(DefineKernel(name, source, self.name, None, warm, group.device()),
                               CallKernel(name, args, grid, meta),
                               stored, source)

    def _warm(self, graph, args, configs):
        if not self.precompiles:
            return None
        return compile_pool.WarmSpec([graph.get_dtype(a) if isinstance(a, Name) else hint(a) for a in args], configs)

    def _tuning(self, k, meta):
        from .triton.heuristics import candidate_configs, row_sized_configs
        ptrs = k.args.call_order()
        written = [i for i, (_, buf) in enumerate(ptrs) if buf in k.args.outputs]
        if k.rblock_at_launch:
            # RBLOCK must cover the row the launch passes: the launcher picks the config per size class
            configs_for = row_sized_configs(k, self.tunes)
            return KernelTuning(configs_for(hint(k.X), hint(k.R)), len(ptrs), k.tiled, written, configs_for)
        if not self.tunes:
            return None
        configs = candidate_configs(k, meta)
        if len(configs) < 2:
            return None
        return KernelTuning(configs, len(ptrs), k.tiled, written)


def generate_kernel(make):
    """Generate with make(materialize) until every load of a kernel-local buffer was forwarded; a load
    that could not be keeps that buffer in memory on the next try."""
    materialize: set = set()
    while True:
        k = make(materialize).generate()
        missing = k.needs_store - materialize
        if not missing:
            return k
        materialize |= missing


def kernel_call_args(k) -> list:
    """The wrapper's arguments for a kernel: buffer pointers, xnumel, rnumel, then size symbols."""
    args = [Name(buf) for _, buf in k.args.call_order()] + [k.X] + ([k.R] if k.has_rdim else [])
    return args + [sympy.Symbol(s) for s in k.args.sizes.values()]


def reads_rows_online(device: torch.device) -> bool:
    """Whether softmax's row statistics should be one online reduction (graph/passes/post_grad.py) for
    kernels on device. Triton: yes, a long row is then read from memory once, not twice. C++: no, a row
    stays in cache between its passes and softmax keeps exp(x - max) in a row buffer from the sum's
    pass for the division (an online sum would compute exp twice)."""
    return device.type != "cpu" or config.cpu_backend == "triton"


def adds_matmul_bias_in_epilogue(device: torch.device) -> bool:
    """Whether a matmul's bias whose result only feeds pointwise ops should be added by those ops' kernel
    (graph/passes/post_grad.unfuse_bias_addmm) instead of by the GEMM. On a GPU under autocast the bias
    needs a bf16 cast kernel of its own before the GEMM can add it: BERT's training step launched 73 of
    them (~2 us of GPU and ~5 us of host time each), where in the epilogue the cast is free."""
    return device.type == "cuda"


def reduction_split_rows(device: torch.device, strided: bool) -> tuple[int, int]:
    """(most, aim) for a reduction of few long rows on device (lowering/reductions._split_count): one of at
    most `most` rows is split into partial rows, about `aim` of them, reduced by a second kernel; more
    rows run as one kernel, one row (or one block of columns, `strided`: reduced along a strided dim) per
    program or thread.

    Triton: a program per long row, per XBLOCK (~64) columns of a strided reduction; 8192 partial rows
    fill an H100 even at XBLOCK 64. Row reductions over 1024 rows and more are not split: those rows are
    already enough programs, and a split LayerNorm or softmax (4096 x 1024, 2048 x 2048) became three and
    five kernels that read their input twice. C++: an OpenMP thread per row (per 64 columns), so only rows
    fewer than the threads are split; strided reductions never are, since the partials' kernel would read
    each (chunk, column) row along the strided dim (ember's C++ column kernels tile only a contiguous x):
    a 2048 x 1024 column sum took 3.8 ms split 8 ways, 0.26 ms as one kernel (2 threads)."""
    if device.type == "cpu" and config.cpu_backend != "triton":
        threads = torch.get_num_threads()
        return (0, 0) if strided else (threads - 1, 8 * threads)
    return (4096, 8192) if strided else (1023, 8192)


def matmul_alignment(device: torch.device) -> int:
    """Bytes that a matmul's sizes should be multiples of on device (0: any size does). cuBLAS picks its
    fast kernels only when every leading dimension is a multiple of 16 bytes; a GEMM over 50257 bf16
    columns (GPT-2's LM head) ran 7x slower on an H200 (graph/passes/post_grad.pad_matmuls)."""
    return 16 if device.type == "cuda" else 0


def guarded_device_index(program):
    """The GPU that guard_current_device makes current while the program runs, else None: no GPU kernel
    (ATen calls follow their tensors' device themselves), "the current device", or kernels on several
    GPUs in one graph (not guarded: each launch would need its own)."""
    indices = {k.device.index for k in program.kernels() if k.backend == "triton" and k.device is not None}
    return next(iter(indices)) if len(indices) == 1 and None not in indices else None


def guard_current_device(fn, program):
    """`fn`, made to run with its kernels' GPU as the current device. Triton launches on the current
    device (its stream, the binary loaded there), not on the device of the tensors it is given: a graph on
    cuda:1 called while cuda:0 is current would run its kernels on cuda:0 with pointers into cuda:1."""
    index = guarded_device_index(program)
    if index is None:
        return fn
    guard = torch.cuda._DeviceGuard
    # C, not torch.cuda.current_device: the guard's enter and exit cost ~1 us a call when nothing changes
    current = getattr(torch._C, "_cuda_getDevice", lambda: None)

    def on_its_device(args):
        if current() == index:
            return fn(args)
        with guard(index):
            return fn(args)
    return on_its_device


def backend_for(device: torch.device):
    if device.type == "cpu":
        config.validate()
        if config.cpu_backend == "triton":
            return TritonBackend(interpret=True)
        from .cpp import CppBackend
        return CppBackend()
    if device.type == "cuda":
        return TritonBackend(interpret=False)
    raise NotImplementedError(f"ember has no kernel backend for device {device}")
