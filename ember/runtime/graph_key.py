"""The graph cache's key: everything that decides the code a graph compiles to.

    graph       the ATen graph, normalized: each node's op, target, arguments (other nodes by position),
                constants and traced value (shape, stride, dtype, device), but not its name, stack trace
                or other metadata (with config.check_nans the names and source lines are part of the
                code, so then they count)
    inputs      each example input's size, stride, storage offset, dtype and device
    shapes      for a graph with symbolic sizes: each symbol's range and the ShapeEnv's guards on the
                graph's symbols (not the symbols' example values, so other sizes that pass the guards
                share the entry)
    kind        forward, backward or inference
    settings    every ember.config field that changes the Wrapper IR (config.NOT_IN_PROGRAM lists the rest)
    ember       a hash of ember's own source files
    versions    Python, torch, Triton, sympy
    devices     the kernel backend per device type, the CPU's model and ISA flags and thread count, each
                GPU's name and compute capability
    matmul      torch's TF32 setting for float32 matrix products (GEMM templates bake it in)

A graph the key cannot describe safely (a Python function or a higher-order op as a target, a submodule,
a tensor baked into an argument, a setting holding a callable, sizes that depend on data) raises
NotCacheable: it is compiled without the cache.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import sys

import sympy
import torch
import torch.fx

from ..config import NOT_IN_PROGRAM, config


class NotCacheable(Exception):
    """Why a graph is compiled without the graph cache."""


_PLAIN = (bool, int, float, str, type(None))
_TORCH_ENUMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
# functions a graph may call by their module and name: Python's operators and math, torch's symbolic helpers
_FUNCTION_MODULES = ("_operator", "operator", "math", "builtins", "torch", "torch.functional")


def _target(n: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    t = n.target
    if n.op in ("placeholder", "output"):
        return ""
    if n.op == "get_attr":
        value = _attr(gm, t)
        if not isinstance(value, torch.Tensor):
            raise NotCacheable(f"get_attr {t} is a {type(value).__name__}")
        return f"{t}={_tensor_digest(value)}"
    if n.op != "call_function":
        raise NotCacheable(f"a {n.op} node")
    if isinstance(t, torch._ops.OpOverload):
        return f"op:{t.namespace}::{t._opname}.{t._overloadname}"
    if isinstance(t, torch._ops.HigherOrderOperator):
        raise NotCacheable(f"the higher-order op {t.name()}")
    module, name = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    if module in _FUNCTION_MODULES and name and "<" not in name:
        return f"fn:{module}.{name}"
    raise NotCacheable(f"the call target {t!r}")


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach()
    if type(t) is not torch.Tensor or t.is_meta or t.layout != torch.strided or t.is_quantized:
        raise NotCacheable(f"a constant {type(t).__name__} of layout {t.layout}")
    data = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{_tensor_meta(t)}#{hashlib.sha256(data).hexdigest()[:32]}"


def _tensor_meta(t) -> str:
    return (f"T({_ints(t.shape)},{_ints(t.stride())},{_size(t.storage_offset())},{t.dtype},"
            f"{_device(t.device)})")


def _device(d: torch.device) -> str:
    return str(d)


def _size(s) -> str:
    if isinstance(s, torch.SymInt):
        expr = s.node.expr
        if not _backed(s):
            raise NotCacheable(f"a size that depends on data ({expr})")
        return f"<{expr}>"
    return str(int(s))


def _backed(s: torch.SymInt) -> bool:
    env = s.node.shape_env
    table = getattr(env, "backed_var_to_val", None)   # torch >= 2.13
    table = env.var_to_val if table is None else table
    return all(sym in table for sym in s.node.expr.free_symbols)


def _ints(xs) -> str:
    return "[" + ",".join(_size(x) for x in xs) + "]"


def _value(v) -> str:
    """A traced value (node.meta['val']) or an example input."""
    if isinstance(v, torch.Tensor):
        return _tensor_meta(v)
    if isinstance(v, torch.SymInt):
        return _size(v)
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        return f"<{type(v).__name__}:{v.node.expr}>"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}(" + ",".join(_value(x) for x in v) + ")"
    if isinstance(v, _PLAIN):
        return repr(v)
    return f"?{type(v).__name__}"


def _arg(a, index: dict) -> str:
    """A node argument, with other nodes by their position in the graph."""
    if isinstance(a, torch.fx.Node):
        return f"%{index[a]}"
    if isinstance(a, (list, tuple)):
        return f"{type(a).__name__}(" + ",".join(_arg(x, index) for x in a) + ")"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k!r}:{_arg(v, index)}" for k, v in a.items()) + "}"
    if isinstance(a, slice):
        return f"slice({_arg(a.start, index)},{_arg(a.stop, index)},{_arg(a.step, index)})"
    if isinstance(a, _PLAIN):
        return f"{type(a).__name__}:{a!r}"
    if isinstance(a, _TORCH_ENUMS):
        return f"{type(a).__name__}:{a}"
    raise NotCacheable(f"an argument of type {type(a).__name__}")


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph, one line per node, without names or metadata that do not change its code."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    lines = []
    for n in gm.graph.nodes:
        line = (f"{n.op} {_target(n, gm)} ({_arg(tuple(n.args), index)}) {{{_arg(dict(n.kwargs), index)}}} "
                f"-> {_value(n.meta.get('val'))}")
        if config.check_nans:      # its errors name the FX nodes and the user's source lines
            line += f" name={n.name} trace={n.meta.get('stack_trace')!r}"
        lines.append(line)
    return "\n".join(lines)


def graph_symbols(gm: torch.fx.GraphModule, example_inputs) -> tuple[set, object]:
    """(the size symbols of the graph's inputs, their ShapeEnv or None). Other values' sizes are expressions
    of these, or sizes that depend on data, which graph_text refuses."""
    symbols, env = set(), None

    def visit(v):
        nonlocal env
        if isinstance(v, torch.Tensor):
            for s in list(v.shape) + list(v.stride()) + [v.storage_offset()]:
                visit(s)
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            symbols.update(v.node.expr.free_symbols)
            env = v.node.shape_env
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            visit(n.meta.get("val"))
    visit(list(example_inputs))
    return symbols, env


def _shapes(symbols: set, env) -> str:
    if not symbols or env is None:
        return ""
    ranges = [f"{s}:{env.var_to_range[s]}" if s in env.var_to_range else f"{s}:?" for s in
              sorted(symbols, key=str)]
    guards = [str(g.expr) for g in env.guards if g.expr.free_symbols & symbols]
    suppressed = getattr(env, "_suppress_guards_tls", None)
    return (f"ranges {ranges} guards {guards} frozen={bool(getattr(env, 'frozen', False))} "
            f"suppressed={bool(suppressed()) if suppressed else None}")


def settings_text(leave_out=NOT_IN_PROGRAM) -> str:
    parts = []
    for f in dataclasses.fields(config):
        if f.name in leave_out:
            continue
        v = getattr(config, f.name)
        if isinstance(v, (list, tuple)) and not v:
            v = ()
        if not isinstance(v, _PLAIN + (tuple,)) or (isinstance(v, tuple) and not all(isinstance(x, _PLAIN) for x in v)):
            raise NotCacheable(f"ember.config.{f.name} holds {type(v).__name__} values")
        parts.append(f"{f.name}={v!r}")
    return " ".join(parts)


@functools.lru_cache(maxsize=None)
def ember_source_hash() -> str:
    """A hash of every Python file of the ember package (a changed ember compiles graphs anew)."""
    return source_hash(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def source_hash(root: str) -> str:
    """A hash of the paths and contents of the Python files under `root`."""
    h = hashlib.sha256()
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read() + b"\0")
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@functools.lru_cache(maxsize=None)
def installed_versions() -> str:
    return (f"python {sys.version_info[:3]} torch {torch.__version__} triton {_version('triton')} "
            f"sympy {sympy.__version__}")


@functools.lru_cache(maxsize=None)
def _cpu() -> str:
    from ..codegen.cpp.build import host_tag
    return hashlib.sha256(host_tag().encode()).hexdigest()[:16]


def _devices(device_types: set) -> str:
    from ..device import backend_for
    parts = []
    for t in sorted(device_types):
        backend = backend_for(t)
        parts.append(f"{t}:{type(backend).__module__}.{type(backend).__qualname__}:{backend.name}")
        if t == "cpu":
            parts.append(f"cpu {_cpu()} threads {torch.get_num_threads()}")
        elif t == "cuda":
            parts.append(f"current {torch.cuda.current_device()} " + " ".join(
                f"{torch.cuda.get_device_name(i)} sm{torch.cuda.get_device_capability(i)}"
                for i in range(torch.cuda.device_count())))
    return " ".join(parts)


def _device_types(gm, example_inputs) -> set:
    found = set()

    def visit(v):
        if isinstance(v, torch.Tensor):
            found.add(v.device.type)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    for n in gm.graph.nodes:
        visit(n.meta.get("val"))
        for a in n.kwargs.values():     # a factory's device=
            if isinstance(a, torch.device):
                found.add(a.type)
    visit(list(example_inputs))
    return found


def graph_key_parts(gm: torch.fx.GraphModule, example_inputs, kind: str) -> dict:
    """The key's parts, each a string (raises NotCacheable)."""
    symbols, env = graph_symbols(gm, example_inputs)
    return {
        "graph": graph_text(gm),
        "inputs": _value(list(example_inputs)),
        "shapes": _shapes(symbols, env),
        "kind": kind,
        **environment_parts(gm, example_inputs),
    }


def environment_parts(gm: torch.fx.GraphModule, example_inputs, settings: str | None = None) -> dict:
    """The parts of a key besides the graph: ember's settings (`settings`, default settings_text()), source
    hash, versions, devices and torch's TF32 setting (raises NotCacheable)."""
    return {
        "settings": settings_text() if settings is None else settings,
        "ember": ember_source_hash(),
        "versions": installed_versions(),
        "devices": _devices(_device_types(gm, example_inputs)),
        # float32 GEMM templates multiply in TF32 or in float32 as these said when they were generated
        "matmul": f"allow_tf32 {torch.backends.cuda.matmul.allow_tf32} cudnn {torch.backends.cudnn.allow_tf32}",
    }


def digest(parts: dict) -> str:
    h = hashlib.sha256()
    for name, text in parts.items():
        h.update(f"{name}\0{text}\0".encode())
    return h.hexdigest()


def graph_key(gm: torch.fx.GraphModule, example_inputs, kind: str) -> str:
    return digest(graph_key_parts(gm, example_inputs, kind))
