"""`@lower(aten.op, ...)`: the table from ATen ops to functions that build IR.

A lowering receives the node's args with tensors as TensorBox and sizes as sympy expressions, and
returns a TensorBox (or a tuple of them). Raising `Unsupported` from a lowering makes the graph fall back
to ATen for that node, which is the right answer whenever a lowering meets a case it does not cover.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..graph.decompose import publish_lowered

lowerings: dict = {}


class Unsupported(Exception):
    """A lowering does not cover these arguments; run the op as an ATen fallback instead."""


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lower_higher_order(op) -> Callable:
    """Register a lowering of a higher-order op (no decomposition to publish)."""
    def register(fn):
        lowerings[op] = fn
        return fn
    return register


def lower(*ops) -> Callable:
    def register(fn):
        for op in ops:
            for overload in _overloads(op):
                lowerings[overload] = fn
                publish_lowered(overload)       # a kept op ember lowers leaves the decomposition table
        return fn
    return register


def get_lowering(target):
    return lowerings.get(target)


def load_all() -> None:
    """Import every lowering module (registration happens at import)."""
    from . import (collectives, concat, creation, fallback, flex_attention, indexing, matmul,  # noqa: F401
                   mutation, pointwise, pooling, random, reductions, scan, scatter, short_attention, upsample, views)
