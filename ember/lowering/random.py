"""Random ops as ember kernels: rand, randn, their *_like forms, bernoulli, native_dropout, randint,
uniform and normal become Pointwise computations over a counter-based generator.

Element i of a random op's output is `ops.rand(seed, offset)` (or randn, randint64) with `offset` the
element's row-major index: a pure function of (seed, offset), so the value does not depend on which
kernel computes it, on fusion, launch order or threads, and inlining the same random value into two
consumers (dropout's output and its mask) gives both the same numbers.

Seeds come from torch's own generator, once per call of the compiled graph: the first random op of a
graph on a device adds a SeedsBuffer, an extern `aten.randint` drawing one int64 seed per random op of
the graph on that device, and each op's kernels load their seed from it. So `torch.manual_seed` makes
ember's runs reproducible, two calls draw different numbers, and two random ops of one graph draw from
different streams. A random op given its own `generator` runs as an ATen fallback (it owns its state).

Values differ from eager's (another generator); what matches eager is the distribution.
"""
from __future__ import annotations

import sympy
import torch

from .. import state
from ..graph.custom_ops import dropout_bits
from ..ir.nodes import ExternKernel, Layout, TensorBox
from ..ir.ops import ops
from ..ir.symbolic import contiguous_strides, is_static, product, sympify
from .creation import constant_box
from .pointwise import broadcast_loader, canonical_device, cast
from .registry import Unsupported, lower

aten = torch.ops.aten

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# a float32 uniform rounded to a narrow float could round up to 1.0: keep the bits that fit instead
_NARROW_BITS = {torch.float16: 11, torch.bfloat16: 8}


class SeedsBuffer(ExternKernel):
    """`aten.randint(0, 2**63 - 1, [n], dtype=int64, device=d)`: one fresh seed per random op of the
    graph on device d, drawn from d's default generator each time the graph runs. Kernels read one seed
    each, at its op's position: the position is all that differs between two layers' dropout kernels."""
    elements_vary = True

    def __init__(self, device: torch.device):
        super().__init__(None, None, aten.randint.low, [], {"dtype": torch.int64, "device": device})
        self.count = 0
        self._resize(device)

    def _resize(self, device):
        # n grows while the graph is lowered; the extern is called (and read) only after that
        self.layout = Layout.contiguous(device, torch.int64, [max(self.count, 1)])
        self.args = [0, 2 ** 63 - 1, [max(self.count, 1)]]

    def reserve(self) -> int:
        self.count += 1
        self._resize(self.layout.device)
        return self.count - 1


def _seeds(device: torch.device) -> SeedsBuffer:
    g = state.current_graph()
    for buf in g.buffers:
        if isinstance(buf, SeedsBuffer) and buf.layout.device == device:
            return buf
    return g.register_buffer(SeedsBuffer(device))


def random_stream(size, device, draw):
    """idx -> draw(seed, offset) for a fresh random op with output `size`: its own seed, and offsets
    the row-major index of the element. Call it after every check that may raise Unsupported (a seed
    reserved by a lowering that then falls back is harmless, but wasted)."""
    size = [sympify(s) for s in size]
    numel = product(size)
    # int32 offsets where they fit: 32-bit index math is cheaper on GPUs, and Triton's Philox takes an
    # int64 counter as its 64-bit variant (other numbers than the C++ backend's, and slower)
    offset_dtype = torch.int32 if is_static(numel) and int(numel) < 2 ** 31 else torch.int64
    strides = contiguous_strides(size)
    seeds = _seeds(canonical_device(device))
    name, k = seeds.get_name(), seeds.reserve()

    def value(idx):
        flat = sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0))
        return draw(ops.load(name, sympy.Integer(k)), ops.index_expr(flat, offset_dtype))
    return value


def _float_dtype(dtype) -> torch.dtype:
    dtype = dtype or torch.get_default_dtype()
    if dtype not in _FLOATS:
        raise Unsupported(f"random floats of dtype {dtype}")
    return dtype


def _plain(*, layout=None, generator=None):
    if generator is not None:
        raise Unsupported("a random op with its own generator")
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")


def _uniform(dtype):
    """draw(seed, offset) -> a uniform in [0, 1) of `dtype` (computed as float32)."""
    bits = _NARROW_BITS.get(dtype)

    def draw(seed, offset):
        u = ops.rand(seed, offset)
        if bits:
            u = ops.mul(ops.floor(ops.mul(u, ops.constant(2.0 ** bits, torch.float32))),
                        ops.constant(2.0 ** -bits, torch.float32))
        return cast(u, torch.float32, dtype)
    return draw


def _normal(dtype):
    return lambda seed, offset: cast(ops.randn(seed, offset), torch.float32, dtype)


def _box(size, device, dtype, draw) -> TensorBox:
    size, device = [sympify(s) for s in size], canonical_device(device)
    return TensorBox.pointwise(device, dtype, random_stream(size, device, draw), size)


# --- rand / randn ---------------------------------------------------------------------------------------

@lower(aten.rand.default)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _plain(layout=layout)
    dtype = _float_dtype(dtype)
    return _box(size, canonical_device(device), dtype, _uniform(dtype))


@lower(aten.randn.default)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _plain(layout=layout)
    dtype = _float_dtype(dtype)
    return _box(size, canonical_device(device), dtype, _normal(dtype))


@lower(aten.rand_like.default)
def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _plain(layout=layout)
    dtype = _float_dtype(dtype or x.dtype)
    return _box(x.get_size(), device or x.device, dtype, _uniform(dtype))


@lower(aten.randn_like.default)
def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _plain(layout=layout)
    dtype = _float_dtype(dtype or x.dtype)
    return _box(x.get_size(), device or x.device, dtype, _normal(dtype))


def _affine_draw(x, sample, scale, shift, generator):
    """x's size, its float dtype, drawn as sample() * scale + shift."""
    _plain(generator=generator)
    dtype = _float_dtype(x.dtype)
    s = sample(dtype)

    def draw(seed, offset):
        return ops.add(ops.mul(s(seed, offset), ops.constant(scale, dtype)), ops.constant(shift, dtype))
    return _box(x.get_size(), x.device, dtype, draw)


@lower(aten.uniform.default)
def uniform(x, low=0.0, high=1.0, *, generator=None):
    return _affine_draw(x, _uniform, high - low, low, generator)


@lower(aten.normal_functional.default)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None):
    return _affine_draw(x, _normal, std, mean, generator)


# --- bernoulli / dropout --------------------------------------------------------------------------------

@lower(aten.bernoulli.p)
def bernoulli_p(x, p=0.5, *, generator=None):
    _plain(generator=generator)
    if x.dtype == torch.bool or x.dtype.is_complex:
        raise Unsupported(f"bernoulli into {x.dtype}")

    def draw(seed, offset):
        return cast(ops.lt(ops.rand(seed, offset), ops.constant(p, torch.float32)), torch.bool, x.dtype)
    return _box(x.get_size(), x.device, x.dtype, draw)


@lower(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, *, generator=None):
    _plain(generator=generator)
    if x.dtype == torch.bool or not p.dtype.is_floating_point or p.device != x.device:
        raise Unsupported("bernoulli with these dtypes or devices")
    size = x.get_size()
    load_p = broadcast_loader(p, size)
    pdt = torch.float64 if p.dtype == torch.float64 else torch.float32
    stream = random_stream(size, x.device, lambda seed, offset: ops.rand(seed, offset))

    def inner_fn(idx):
        keep = ops.lt(cast(stream(idx), torch.float32, pdt), cast(load_p(idx), p.dtype, pdt))
        return cast(keep, torch.bool, x.dtype)
    return TensorBox.pointwise(x.device, x.dtype, inner_fn, size)


@lower(aten.native_dropout.default)
def native_dropout(x, p, train):
    """(x * mask / (1 - p), mask) with mask ~ bernoulli(1 - p). Both outputs compute the mask from the
    same (seed, offset), so they agree wherever each is computed; the backward graph gets the mask as
    a saved forward output (the partitioner never recomputes a random op)."""
    size, dtype = x.get_size(), x.dtype
    if not dtype.is_floating_point:
        raise Unsupported("dropout of a non-float tensor")
    if train is False or p == 0:
        return TensorBox.pointwise(x.device, dtype, x.make_loader(), size), \
            constant_box(True, size, torch.bool, x.device)
    if p == 1:
        return constant_box(0, size, dtype, x.device), constant_box(False, size, torch.bool, x.device)
    stream = random_stream(size, x.device, lambda seed, offset: ops.rand(seed, offset))
    load = x.make_loader()

    def keep(idx):
        return ops.ge(stream(idx), ops.constant(p, torch.float32))

    def out(idx):
        # a product, not a select: a dropped NaN or inf stays NaN, as in eager
        scale = ops.where(keep(idx), ops.constant(1.0 / (1.0 - p), dtype), ops.constant(0.0, dtype))
        return ops.mul(load(idx), scale)
    return TensorBox.pointwise(x.device, dtype, out, size), TensorBox.pointwise(x.device, torch.bool, keep, size)


@lower(dropout_bits)
def dropout_keep_bits(nbytes, p, device):
    """ember::dropout_bits: byte i holds the keep flags of elements 8i .. 8i + 7, from the two Philox draws
    ops.keep_bits8 makes per byte (a quarter of what one rand per element costs)."""
    if not (is_static(nbytes) and int(nbytes) < 2 ** 30):
        raise Unsupported("dropout bits of 2**33 elements or more")       # their offsets need int64
    bits = _box([nbytes], canonical_device(device), torch.uint8,
                lambda seed, offset: ops.keep_bits8(seed, offset, float(p)))
    # stored, and read by its readers: inlined, each element would make its byte's two draws again
    bits.realize()
    return bits


# --- randint --------------------------------------------------------------------------------------------

def _randint(low, high, size, dtype, device) -> TensorBox:
    low, high = sympify(low), sympify(high)
    if not (low.is_Integer and high.is_Integer) or int(high) <= int(low):
        raise Unsupported("randint with symbolic or empty bounds")
    if dtype == torch.bool or dtype.is_complex:
        raise Unsupported(f"randint of dtype {dtype}")
    low, high = int(low), int(high)

    def draw(seed, offset):
        r = ops.randint64(seed, offset, ops.constant(low, torch.int64), ops.constant(high, torch.int64))
        return cast(r, torch.int64, dtype)
    return _box(size, device, dtype, draw)


@lower(aten.randint.low)
def randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _plain(layout=layout)
    return _randint(low, high, size, dtype or torch.int64, canonical_device(device))


@lower(aten.randint.default)
def randint(high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _plain(layout=layout)
    return _randint(0, high, size, dtype or torch.int64, canonical_device(device))


@lower(aten.randint_like.low_dtype)
def randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _plain(layout=layout)
    return _randint(low, high, x.get_size(), dtype or x.dtype, device or x.device)


@lower(aten.randint_like.default)
def randint_like(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _plain(layout=layout)
    return _randint(0, high, x.get_size(), dtype or x.dtype, device or x.device)
