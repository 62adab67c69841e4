"""A compiled graph whose kernels launch on the current device (Triton's do: on its stream, with the
binary loaded there, not on the device of the tensors it is given) runs with that device made current.
A graph on cuda:1 called while cuda:0 is current would otherwise run its kernels on cuda:0 with pointers
into cuda:1."""
from __future__ import annotations

import torch


def guarded_device_index(program):
    """The GPU that guard_current_device makes current while the program runs, else None: no kernel that
    launches on the current device (ATen calls follow their tensors' device themselves), "the current
    device", or kernels on several GPUs in one graph (not guarded: each launch would need its own)."""
    indices = {k.device.index for k in program.kernels()
               if k.backend.launches_on_current_device and k.device is not None}
    return next(iter(indices)) if len(indices) == 1 and None not in indices else None


def guard_current_device(fn, program):
    """`fn`, made to run with its kernels' GPU as the current device."""
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
