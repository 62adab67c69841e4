"""Where a host-bound loop spends its time, without a tracing profiler: a daemon thread samples one thread's
Python stack at a fixed interval and counts, per sample, the functions and the layers (Dynamo, AOTAutograd,
ember, inductor, FSDP, ...) on it.

torch.profiler and cProfile add a cost to every op or call they record, which changes a host-bound step's
time and the share of each part (a path with many small ATen calls pays more). Sampling costs the same
per sample wherever the thread is. The interpreter's switch interval is lowered while sampling so that
the sampled thread yields the GIL often enough; time inside a C call is counted at the Python frame that
made it.

    with HostSampler() as sampler:
        run_steps()
    sampler.summary()     # {"samples", "layers_inclusive", "layers_self", "functions_inclusive", "functions_self"}
"""
from __future__ import annotations

import collections
import sys
import threading
import time

# path fragment -> layer; the first that matches a frame's file names its layer (generated wrappers: ember's
# and inductor's cache directories)
LAYERS = (("ember_wrapper_", "ember"), ("torchinductor_", "inductor"), ("torch/_dynamo", "dynamo"), ("torch/_functorch", "aot_autograd"), ("torch/_inductor", "inductor"),
          ("torch/distributed/fsdp", "fsdp"), ("torch/distributed/tensor", "dtensor"),
          ("torch/distributed", "distributed"), ("torch/optim", "optim"), ("torch/autograd", "autograd"),
          ("/ember/", "ember"), ("triton/", "triton"), ("torch/", "torch"))


def layer_of(filename: str) -> str:
    name = filename.replace("\\", "/")
    return next((layer for part, layer in LAYERS if part in name), "program")


def _function(code) -> str:
    parts = code.co_filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{code.co_name}"


class HostSampler:
    def __init__(self, interval_s: float = 0.0005, thread_id: int | None = None):
        self.interval_s = interval_s
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.samples = 0
        self.layers_inclusive: collections.Counter = collections.Counter()
        self.layers_self: collections.Counter = collections.Counter()
        self.functions_inclusive: collections.Counter = collections.Counter()
        self.functions_self: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._switch = None

    def __enter__(self):
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval_s)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.interval_s)
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            self.samples += 1
            self.functions_self[_function(frame.f_code)] += 1
            self.layers_self[layer_of(frame.f_code.co_filename)] += 1
            functions, layers = set(), set()
            while frame is not None:
                functions.add(_function(frame.f_code))
                layers.add(layer_of(frame.f_code.co_filename))
                frame = frame.f_back
            self.functions_inclusive.update(functions)
            self.layers_inclusive.update(layers)

    def summary(self, top: int = 40) -> dict:
        n = max(self.samples, 1)

        def shares(counter, k):
            return [[key, round(count / n, 4)] for key, count in counter.most_common(k)]
        return {"samples": self.samples, "layers_inclusive": shares(self.layers_inclusive, None),
                "layers_self": shares(self.layers_self, None),
                "functions_inclusive": shares(self.functions_inclusive, top),
                "functions_self": shares(self.functions_self, top)}
