"""Ops ember adds to ATen graphs (namespace `ember`, through torch.library): what a post-grad pass rewrites
a pattern into where ember has one kernel for what ATen spells as several ops. Each has an eager
implementation, so a fake-tensor run and an ATen fallback work as for any op, and an ember lowering.

    ember::softmax_stats(x, dim) -> (amax(x, dim, keepdim=True), sum(exp(x - amax), dim, keepdim=True))
        softmax's and log-softmax's row statistics as one reduction that reads each row once (an online
        max and rescaled sum, where a long row is reduced in chunks); lowered in lowering/reductions.py.
"""
from __future__ import annotations

import torch

_lib = torch.library.Library("ember", "DEF")
_lib.define("softmax_stats(Tensor x, int dim) -> (Tensor, Tensor)")


def _softmax_stats(x: torch.Tensor, dim: int):
    m = torch.amax(x, dim, keepdim=True)
    return m, torch.exp(x - m).sum(dim, keepdim=True)


_lib.impl("softmax_stats", _softmax_stats, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::softmax_stats")
def _softmax_stats_fake(x: torch.Tensor, dim: int):
    shape = list(x.shape)
    shape[dim] = 1
    return x.new_empty(shape), x.new_empty(shape)


softmax_stats = torch.ops.ember.softmax_stats.default
