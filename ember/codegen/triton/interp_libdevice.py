"""libdevice for the Triton interpreter (TRITON_INTERPRET=1, the CPU test path): the interpreter does
not patch triton.language.extra.libdevice, so kernels running there bind `libdevice` to this module,
which applies numpy to the interpreter's tensors."""
from __future__ import annotations

import math

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _apply(np_fn, *args):
    t = next(a for a in args if isinstance(a, tl.core.tensor))
    data = [a.handle.data if isinstance(a, tl.core.tensor) else a for a in args]
    with np.errstate(all="ignore"):
        out = np.asarray(np_fn(*data))
    out = out.astype(t.handle.data.dtype, copy=False)
    return tl.core.tensor(TensorHandle(out, t.handle.dtype.scalar if hasattr(t.handle.dtype, "scalar") else t.handle.dtype), t.type)


def _unary(np_fn):
    return lambda x: _apply(np_fn, x)


def _binary(np_fn):
    return lambda x, y: _apply(np_fn, x, y)


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
_lgamma = np.vectorize(lambda v: math.lgamma(v) if v > 0 or v != math.floor(v) else float("inf"), otypes=[np.float64])


def _erfinv(y):
    import torch
    return torch.special.erfinv(torch.from_numpy(np.asarray(y, dtype=np.float64))).numpy()


tanh = _unary(np.tanh)
erf = _unary(_erf)
erfc = _unary(_erfc)
erfinv = _unary(_erfinv)
lgamma = _unary(_lgamma)
log1p = _unary(np.log1p)
expm1 = _unary(np.expm1)
log10 = _unary(np.log10)
sqrt = _unary(np.sqrt)
rsqrt = _unary(lambda v: 1.0 / np.sqrt(v))
floor = _unary(np.floor)
ceil = _unary(np.ceil)
trunc = _unary(np.trunc)
nearbyint = _unary(np.rint)
tan = _unary(np.tan)
asin = _unary(np.arcsin)
acos = _unary(np.arccos)
atan = _unary(np.arctan)
sinh = _unary(np.sinh)
cosh = _unary(np.cosh)
asinh = _unary(np.arcsinh)
acosh = _unary(np.arccosh)
atanh = _unary(np.arctanh)
signbit = _unary(lambda v: np.signbit(v).astype(np.int32))
pow = _binary(np.power)
fmod = _binary(np.fmod)
atan2 = _binary(np.arctan2)
hypot = _binary(np.hypot)
copysign = _binary(np.copysign)
