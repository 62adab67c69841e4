"""Run-time checks the generated wrapper calls."""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("ember")


def _mismatch(t: torch.Tensor, size, stride, dtype=None) -> str | None:
    """'size', 'stride' or 'dtype' where `t` differs from the expected layout; size-1 dims' strides never
    matter; dtype None: not checked."""
    if tuple(t.size()) != size:
        return "size"
    if any(n != 1 and a != b for n, a, b in zip(size, t.stride(), stride)):
        return "stride"
    if dtype is not None and t.dtype != dtype:
        return "dtype"
    return None


def _message(t, size, stride, name, dtype=None) -> str:
    return (f"ember: {name} has an unexpected layout: size {tuple(t.size())} stride {tuple(t.stride())} "
            f"dtype {t.dtype}, expected size {size} stride {stride}" + (f" dtype {dtype}" if dtype else ""))


def check_layout(t: torch.Tensor, size, stride, name: str, dtype=None) -> None:
    """An extern (ATen) output must have the layout ember's kernels will read it with. Its layout comes
    from the op's meta function, which can disagree with the real kernel (seen with cuDNN attention's
    strides, and with the dtype of _batch_norm_with_update_functional's running statistics in 16-bit
    floats): raise instead of reading it wrongly."""
    if t is None or (t.size() == size and t.stride() == stride and (dtype is None or t.dtype == dtype)):
        return          # an optional output the op left undefined (cuDNN attention's debug mask ...), or as promised
    size, stride = tuple(size), tuple(stride)
    if _mismatch(t, size, stride, dtype):
        raise AssertionError(_message(t, size, stride, name, dtype))


def conform_layout(t: torch.Tensor, size, stride, name: str, dtype=None) -> torch.Tensor:
    """`t`, or a copy of it with the strides and dtype the op's meta function promised when the real
    kernel chose others (cuDNN attention returns its output contiguous for contiguous inputs, its meta
    says (B, S, H, D)-major). Only for outputs that alias nothing, so a copy changes no one's view of
    memory. A wrong size is never conformed: it means the graph itself is wrong."""
    if t is None or (t.size() == size and t.stride() == stride and (dtype is None or t.dtype == dtype)):
        return t        # as promised: the common case, decided with no Python loop
    size, stride = tuple(size), tuple(stride)
    what = _mismatch(t, size, stride, dtype)
    if what is None:
        return t
    if what == "size":
        raise AssertionError(_message(t, size, stride, name, dtype))
    log.debug("%s: copying into the promised layout", _message(t, size, stride, name, dtype))
    return torch.empty_strided(size, stride, dtype=dtype or t.dtype, device=t.device).copy_(t)


def debug_sync(what: str) -> None:
    """config.debug_sync: wait for the GPU after `what` (a kernel or extern call) and name it if the GPU
    reports an error. A fault is otherwise reported by whatever CUDA call comes next, often a later kernel's
    launch, and even CUDA_LAUNCH_BLOCKING=1 does not cover library kernels (cuDNN) that launch on their own."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    try:
        torch.cuda.synchronize()
    except Exception as e:
        raise RuntimeError(f"ember debug_sync: the GPU reported an error right after {what}: {e}") from e



class EmberNanError(RuntimeError):
    """config.check_nans: a kernel or extern call wrote NaN or Inf. Never turned into the eager fallback
    of config.fallback_on_error: the graph ran, and eager would compute the same values."""


def _tensors(value, where: str):
    """(tensor, where) for each floating tensor in an output (an extern may return a tuple or list)."""
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and value.numel() > 0:
            yield value, where
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"element {i} of {where}")


def check_finite(what: str, values: list, origins: list, reads: dict | None = None) -> None:
    """config.check_nans: raise EmberNanError if any of `values` (what the call `what` just wrote, each
    described by its entry of `origins`) holds NaN or Inf. One reduction per value on the device and one
    synchronization for the call; `reads`, the tensors the call read, are looked at only to explain a failure."""
    found = [(t, where) for v, o in zip(values, origins) for t, where in _tensors(v, o)]
    if not found:
        return
    finite = [torch.isfinite(t).all() for t, _ in found]
    if bool(torch.stack(finite).all() if len(finite) > 1 else finite[0]):
        return
    t, where = next(f for ok, f in zip(finite, found) if not bool(ok))
    nans, infs = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    msg = f"ember check_nans: {what} wrote {nans} NaN and {infs} Inf (of {t.numel()} values) to {where}"
    held = [name for name, r in (reads or {}).items()
            if any(not bool(torch.isfinite(x).all()) for x, _ in _tensors(r, name))]
    if held:
        msg += f"; what it read held NaN or Inf already: {', '.join(held)}"
    raise EmberNanError(msg)
