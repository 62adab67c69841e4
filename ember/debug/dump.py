"""EMBER_DEBUG=1: a folder per compiled graph with every intermediate form."""
from __future__ import annotations

import itertools
import os

from .. import config

_counter = itertools.count()


class DebugDump:
    """Collects the stages of one compile; writes them only when config.debug is on."""

    def __init__(self, kind: str):
        self.enabled = config.debug
        self.dir = None
        if self.enabled:
            self.dir = os.path.join(config.debug_dir, f"graph_{next(_counter):03d}_{kind}")
            os.makedirs(self.dir, exist_ok=True)

    def write(self, filename: str, text) -> None:
        if not self.enabled:
            return
        if callable(text):
            text = text()
        with open(os.path.join(self.dir, filename), "w") as f:
            f.write(text)
