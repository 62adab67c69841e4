"""Kernel backends as objects, and the one registry that picks a backend for a device.

A kernel backend turns fused groups into kernels for one kind of device and loads them. Its policies —
how a matmul's sizes should be aligned, whether a reduction of few long rows is split, whether softmax's
row statistics are one online reduction — are attributes and methods of the object, so the passes and
lowerings ask `backend_for(device)` instead of branching on the device or on a setting. Nothing in this
module knows a particular backend: `ember/codegen/__init__.py` registers the built-in ones (Triton for
CUDA, C++/OpenMP and Triton's interpreter for CPUs); another backend (ROCm, XPU, a new CPU ISA) is a
folder under `ember/codegen/` plus one `register_backend` call.

Which backend a device type gets: its default, or for a device type with a setting in `ember.config`
(`cpu_backend` for "cpu"), the backend that setting names.
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import config


class KernelBackend:
    """What every kernel backend provides. Subclasses set the attributes and implement the methods."""

    name: str = ""                       # registered choice for its device type, and its kernels' label
    device_type: str = ""
    file_extension: str = ""             # of its kernel sources, in debug dumps ("py", "cpp")
    interpreted: bool = False            # kernels run in an interpreter: correct but slow (keep sizes small)
    # launches run on the current device rather than on their tensors' device: a graph whose kernels run
    # on one device makes it current for the call (codegen/wrapper/device_guard.py)
    launches_on_current_device: bool = False

    # -- policies the passes and lowerings ask for --------------------------------------------------------
    # bytes that a matmul's sizes should be multiples of (0: any size does; graph/passes/post_grad.py)
    matmul_alignment: int = 0
    # a matmul bias whose result only feeds pointwise ops is added by those ops' kernel, not by the GEMM
    adds_matmul_bias_in_epilogue: bool = False
    # activations the device's GEMM library applies with a matmul's bias in its epilogue, for 16-bit
    # products ("relu", "gelu_tanh": cuBLASLt through ATen's `_addmm_activation`; graph/passes/library_epilogues.py)
    library_bias_activations: frozenset = frozenset()
    # a convolution's bias is added by the kernel that reads its output, not by the convolution library
    adds_convolution_bias_in_epilogue: bool = False
    # softmax's row statistics (max, sum of exp) as one online reduction, reading a long row once
    reads_rows_online: bool = False
    # renders GEMM templates (ir/template.py) with their pointwise consumers fused in: matrix products
    # lowered as TemplateBuffers instead of ATen calls where ember.config.gemm_templates allows
    gemm_templates: bool = False
    # times kernel candidates (launch configs at first call)
    tunes: bool = False
    # a method taking (a list of ir.template.ProductSpec, the device) and returning {spec: the template's
    # launch config, or None for the library call}, chosen by timing before the graph is lowered
    # (gemm_templates="auto"); None: the backend cannot choose, and "auto" keeps the library calls
    choose_products = None
    # a method taking an ir.template.ProductSpec and answering whether the backend's template is known, with
    # no timing, to be faster than the library call for it (gemm_templates "matvec" and "auto"); None: never
    prefers_template = None
    # the device's convolution library (cuDNN, oneDNN) runs 2-D convolutions fastest channels-last: plan
    # conv-heavy graphs so (graph/passes/conv_layout.py)
    channels_last_convolutions: bool = False
    # a load of a constant element of a buffer whose `elements_vary` (ir/nodes.py) takes the element's position
    # as a launch argument, not as a literal of the source: kernels that differ only there are one kernel
    element_arguments: bool = False
    # independent small pointwise kernels launch as one combined kernel (schedule/combine.py), rendered by
    # `generate_combined`
    combines_kernels: bool = False
    # how pointwise kernels choose 2-D tiles: a schedule.tiling.TilingPolicy (None: they never tile)
    tiling = None
    # FlexAttention's kernels: a method taking an ir.kernel_call.FlexAttentionSpec and returning (extra input
    # buffers, Launches), raising Unsupported where they do not apply (lowering/flex_attention.py); None:
    # the backend has none and the higher-order op runs as the ATen op
    flex_attention_launches = None
    # kernels for attention with few queries per key/value head: a method taking an
    # ir.kernel_call.ShortQueryAttentionSpec and returning (the (dtype, size) of its scratch results, Launches)
    # (lowering/short_attention.py); None: the fused ATen op runs
    short_query_attention_launches = None

    def reduction_split_rows(self, strided: bool) -> tuple[int, int]:
        """(most, aim) for a reduction of few long rows (lowering/reductions.py): one of at most `most`
        rows is split into about `aim` partial rows, reduced by a second kernel. `strided`: the rows are
        reduced along a strided dim. (0, 0): never split."""
        return (0, 0)

    def prepare(self) -> None:
        """A graph with tensors on this backend's device is about to be traced and compiled: start what takes
        long to boot (compile workers), so that it boots while AOTAutograd traces."""

    def warm_up(self) -> None:
        """A graph with tensors on this backend's device reached ember, to be compiled or loaded from a cache:
        start in the background what its first launch will need and takes long to compute."""

    def runtime_row_copy_ahead(self, dtype, n: int, src_stride: int, dst_stride: int) -> None:
        """A graph being compiled will copy rows of `n` elements between these row strides at run time (the
        chunks of ember::padded_mm, graph/custom_ops.py): start building the kernel that copies them, where
        the backend has one to build."""

    # -- code ---------------------------------------------------------------------------------------------
    def generate(self, name: str, group, graph, local: set):
        """One fused group -> a codegen.generate.GeneratedKernel (its DefineKernel and CallKernel lines)."""
        raise NotImplementedError

    def generate_combined(self, name: str, parts: list, graph):
        """[(group, its kernel-local buffers)] -> one GeneratedKernel running every part, or None where a
        part cannot be one (those groups then get kernels of their own). For backends that combine_kernels."""
        return None

    def load(self, kernels: list) -> dict:
        """This backend's DefineKernel lines of one graph -> {kernel name: launchable}."""
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} for {self.device_type}>"


# device type -> the ember.config field that names its backend (device types without one use the default)
_SETTINGS = {"cpu": "cpu_backend"}
_FACTORIES: dict[tuple[str, str], Callable[[], KernelBackend]] = {}
_DEFAULTS: dict[str, str] = {}
_INSTANCES: dict[tuple[str, str], KernelBackend] = {}


def register_backend(device_type: str, name: str, factory: Callable[[], KernelBackend], *,
                     default: bool = False) -> None:
    """Make `factory()` the backend `name` for `device_type` (called once, at its first use)."""
    _FACTORIES[(device_type, name)] = factory
    _INSTANCES.pop((device_type, name), None)
    if default or device_type not in _DEFAULTS:
        _DEFAULTS[device_type] = name


def backend_names(device_type: str) -> list[str]:
    """The backends registered for a device type."""
    return [n for (t, n) in _FACTORIES if t == device_type]


def backend_for(device) -> KernelBackend:
    """The kernel backend for `device` (a torch.device or a string such as "cuda:0")."""
    device_type = torch.device(device).type
    setting = _SETTINGS.get(device_type)
    name = getattr(config, setting) if setting else _DEFAULTS.get(device_type)
    if (device_type, name) not in _FACTORIES:
        choices = backend_names(device_type)
        if setting and choices:
            raise ValueError(f"ember.config.{setting}={name!r}: use one of {', '.join(map(repr, choices))}")
        raise NotImplementedError(f"ember has no kernel backend for device {device}")
    return registered_backend(device_type, name)


def registered_backend(device_type: str, name: str) -> KernelBackend:
    """The backend registered as `name` for `device_type` (KeyError if none is)."""
    key = (device_type, name)
    if key not in _INSTANCES:
        _INSTANCES[key] = _FACTORIES[key]()
    return _INSTANCES[key]


def backend_key(backend: KernelBackend) -> tuple[str, str]:
    """(device type, registered name) of a backend made by the registry: how a cached program names it."""
    for key, instance in _INSTANCES.items():
        if instance is backend:
            return key
    raise KeyError(f"{backend!r} was not made by ember's backend registry")


def check_backend_settings() -> None:
    """Raise a clear error for an ember.config field that names no registered backend."""
    for device_type, setting in _SETTINGS.items():
        name, choices = getattr(config, setting), backend_names(device_type)
        if name not in choices:
            raise ValueError(f"ember.config.{setting}={name!r}: use one of {', '.join(map(repr, choices))}")
