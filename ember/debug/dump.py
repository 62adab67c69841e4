"""The stages of one compile (FX graphs, loop IR before and after fusion, kernels, wrapper, a summary), each
written where someone reads it: a folder per graph under config.debug_dir when config.debug is on
(EMBER_DEBUG=1), and an artifact of torch's structured trace when one is being written (TORCH_TRACE=dir),
which `tlparse` shows in the compile's folder next to Dynamo's and AOTAutograd's artifacts.

A stage's text is passed as a callable and built at most once, only when one of the two reads it."""
from __future__ import annotations

import itertools
import os
from typing import Callable, Union

from torch._logging import trace_structured

from .. import config

_counter = itertools.count()


class DebugDump:
    """Collects the stages of one compile of a `kind` graph (forward, backward or inference)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.enabled = config.debug
        self.dir = None
        if self.enabled:
            self.dir = os.path.join(config.debug_dir, f"graph_{next(_counter):03d}_{kind}")
            os.makedirs(self.dir, exist_ok=True)

    def write(self, filename: str, text: Union[str, Callable[[], str]]) -> None:
        """Stage `filename` ("post_grad_graph.txt", "kernels.cpp"); in the trace it is the artifact
        "ember_<kind>_<filename>", without ".txt" and with "_" for other dots ("ember_forward_post_grad_graph",
        "ember_forward_kernels_cpp")."""
        build = _once(text)
        if self.enabled:
            with open(os.path.join(self.dir, filename), "w") as f:
                f.write(build())
        stem = filename[:-len(".txt")] if filename.endswith(".txt") else filename
        name = f"ember_{self.kind}_{stem.replace('.', '_')}"
        # trace_structured calls payload_fn only while a structured trace has a handler
        trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": "string"}, payload_fn=build)


def _once(text) -> Callable[[], str]:
    if not callable(text):
        return lambda: text
    built = []

    def build() -> str:
        if not built:
            built.append(text())
        return built[0]
    return build
