"""The Wrapper IR (a WrapperProgram) as bytes and back, for the graph cache.

Pickle's format, with two restrictions that make loading safe to do on a file from the cache:
- Objects with no safe pickled form get a small explicit one: an ATen op is its qualified name
  (`torch.ops.aten.add.Tensor`, looked up again), a kernel backend is its registry entry (device type,
  name), a constant tensor is its dtype, size, stride, storage offset, device and bytes. Any other
  callable, a tensor subclass or a fake tensor makes `dumps` raise NotCacheable.
- Loading resolves only allow-listed classes: the Wrapper IR's dataclasses, what a kernel's tuning holds,
  sympy's expression classes, torch's dtypes, layouts, memory formats and devices, and the three
  rebuilders above. Nothing else is imported or called, whatever the bytes say.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import pickle

import sympy
import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

from ..device import KernelBackend, backend_key, registered_backend
from .graph_key import NotCacheable

MAX_CONSTANT_BYTES = 64 << 20      # a graph whose constants hold more is not cached

# module -> class names loading may resolve
_ALLOWED = {
    "ember.codegen.wrapper.lines": None,                 # every dataclass there, and Name
    "ember.runtime.autotune": {"KernelTuning"},
    "ember.runtime.compile_pool": {"WarmSpec"},
    "ember.runtime.template_choice": {"TemplateTuning", "ExternProduct"},
    "ember.codegen.triton.heuristics": {"RowSizedConfigs"},
    "builtins": {"list", "dict", "set", "frozenset", "slice", "complex"},
}
_SYMPY_MODULES = ("sympy.", "torch.utils._sympy.", "ember.ir.symbolic")


def _op(namespace: str, name: str, overload: str):
    if not all(isinstance(p, str) and p.isidentifier() and not p.startswith("__") for p in (namespace, name, overload)):
        raise pickle.UnpicklingError(f"not an op name: {namespace!r}.{name!r}.{overload!r}")
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    if not isinstance(op, torch._ops.OpOverload):
        raise pickle.UnpicklingError(f"torch.ops.{namespace}.{name}.{overload} is not an op overload")
    return op


def _backend(device_type: str, name: str):
    return registered_backend(device_type, name)


def _tensor(dtype: torch.dtype, size: tuple, stride: tuple, offset: int, device: str, data: bytes):
    storage = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    storage = storage.to(device)
    return torch.empty(0, dtype=dtype, device=device).set_(storage.untyped_storage(), offset, size, stride)


_REBUILDERS = {"_op": _op, "_backend": _backend, "_tensor": _tensor}


class _Pickler(pickle.Pickler):
    def __init__(self, f):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.constant_bytes = 0

    def reducer_override(self, obj):
        if isinstance(obj, torch._ops.OpOverload):
            return _op, (obj.namespace, obj._opname, obj._overloadname)
        if isinstance(obj, KernelBackend):
            return _backend, backend_key(obj)
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if type(obj) in (immutable_list, immutable_dict):    # FX's read-only containers, as plain ones
            return (list, (list(obj),)) if isinstance(obj, list) else (dict, (dict(obj),))
        if isinstance(obj, (torch._ops.OperatorBase, torch._ops.OpOverloadPacket)):
            raise NotCacheable(f"the op {obj}")
        if callable(obj) and not isinstance(obj, type) and not isinstance(obj, sympy.Basic) \
                and not dataclasses.is_dataclass(obj) and obj not in _REBUILDERS.values():
            raise NotCacheable(f"a callable {type(obj).__name__} in the program: {obj!r}")
        return NotImplemented

    def _tensor(self, t: torch.Tensor):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_meta or t.layout != torch.strided \
                or t.is_quantized:
            raise NotCacheable(f"a constant {type(t).__name__}")
        t = t.detach()
        storage = t.untyped_storage()
        self.constant_bytes += storage.nbytes()
        if self.constant_bytes > MAX_CONSTANT_BYTES:
            raise NotCacheable(f"constants of more than {MAX_CONSTANT_BYTES >> 20} MB")
        data = torch.empty(0, dtype=torch.uint8).set_(storage.cpu()).numpy().tobytes()
        return _tensor, (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.device), data)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == __name__ and name in _REBUILDERS:
            return _REBUILDERS[name]
        if module == "torch":
            obj = getattr(torch, name, None)
            if name == "device" or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        elif module in _ALLOWED:
            names = _ALLOWED[module]
            obj = getattr(importlib.import_module(module), name, None)
            if names is None and (dataclasses.is_dataclass(obj) or name == "Name") or names and name in names:
                return obj
        elif module.startswith(_SYMPY_MODULES):
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and issubclass(obj, sympy.Basic):
                return obj
        raise pickle.UnpicklingError(f"ember graph cache: {module}.{name} is not allowed in a cached program")


def dumps(obj) -> bytes:
    """Raises NotCacheable when something in `obj` has no safe form (checked by loading it back)."""
    f = io.BytesIO()
    try:
        _Pickler(f).dump(obj)
        data = f.getvalue()
        loads(data)
    except NotCacheable:
        raise
    except Exception as e:
        raise NotCacheable(f"{type(e).__name__}: {e}") from e
    return data


def loads(data: bytes):
    return _Unpickler(io.BytesIO(data)).load()
