"""Decompositions of ATen's `_foreach_*` ops (what `torch.optim`'s foreach and capturable steps, gradient
clipping and `torch._foreach_*` call) into one op per list element.

`_foreach_add.List(xs, ys, alpha=a)` is `[add.Tensor(x, y, alpha=a) for x, y in zip(xs, ys)]`: each element's
ops then reach the scheduler as ordinary pointwise ops, and an optimizer's whole update of one parameter
(AdamW: the moments, the bias corrections, the step) fuses into one kernel that reads the parameter, its
gradient and its state once, where eager runs one multi-tensor kernel per op over every parameter.

Each decomposition is built from the foreach op's schema: a `Tensor[]` or `Scalar[]` argument gives its i-th
element to the i-th call, any other argument (a Scalar, one shared Tensor) goes to every call. The element op
is ATen's op of the same name, resolved by the packet from the arguments' types (`pow.ScalarAndTensor` calls
`pow.Scalar`, `clamp_min.List` calls `clamp_min.Tensor`), but for the few below whose element op differs.

The reductions (`_foreach_norm`, gradient clipping's; `_foreach_max`) stay ATen calls: ATen reduces every
tensor of the list in one multi-tensor launch, where one op per element is a kernel per tensor.
"""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

PREFIX = "_foreach_"


def _addc(op):
    """addcmul / addcdiv: the value is keyword-only on the element op; the `.Tensor` overload holds the values
    in a 1-D tensor (on the CPU), whose i-th element is multiplied in as a tensor."""
    def element(x, a, b, value=1, *, index=None):
        if isinstance(value, torch.Tensor):
            product = aten.mul(a, b) if op is aten.addcmul else aten.div(a, b)
            return aten.add(x, aten.mul(product, value[index]))
        return op(x, a, b, value=value)
    return element


# reductions over each tensor: one multi-tensor ATen launch beats a kernel per tensor
KEPT = frozenset({"norm", "max", "powsum"})

# element ops that are not ATen's op of the foreach op's name
_ELEMENT = {
    "maximum": lambda x, other: aten.maximum(x, other) if isinstance(other, torch.Tensor) else aten.clamp_min(x, other),
    "minimum": lambda x, other: aten.minimum(x, other) if isinstance(other, torch.Tensor) else aten.clamp_max(x, other),
    "zero": lambda x: aten.zeros_like(x),
    "addcmul": _addc(aten.addcmul),
    "addcdiv": _addc(aten.addcdiv),
}


def _is_list(arg) -> bool:
    return isinstance(arg.type, torch.ListType)


def _decomposition(op: torch._ops.OpOverload, base: str, element):
    schema = op._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    wants_index = base in ("addcmul", "addcdiv") and op._overloadname == "Tensor"

    def decomposed(*args, **kwargs):
        values = list(args) + [kwargs[a.name] if a.name in kwargs else a.default_value
                               for a in positional[len(args):]]
        keywords = {a.name: kwargs[a.name] for a in schema.arguments if a.kwarg_only and a.name in kwargs}
        lists = [i for i, a in enumerate(positional) if _is_list(a)]
        count = len(values[lists[0]])
        out = []
        for i in range(count):
            call = [v[i] if j in lists else v for j, v in enumerate(values)]
            out.append(element(*call, **keywords, index=i) if wants_index else element(*call, **keywords))
        return out
    decomposed.__name__ = f"decomposed_{op._schema.name.split('::')[-1]}_{op._overloadname}"
    return decomposed


@functools.lru_cache(None)
def foreach_decompositions() -> dict:
    """{each functional `aten._foreach_*` overload with an element op: its decomposition}."""
    table = {}
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name.split("::")[-1]
        if not schema.name.startswith("aten::" + PREFIX) or name.endswith("_") or \
                schema.overload_name.endswith("out") or any(a.is_out for a in schema.arguments):
            continue
        base = name[len(PREFIX):]
        element = None if base in KEPT else _ELEMENT.get(base) or getattr(aten, base, None)
        if element is None:
            continue           # a reduction, or no element op: the foreach op stays an ATen call
        op = getattr(getattr(aten, name), schema.overload_name or "default")
        table[op] = _decomposition(op, base, element)
    return table
