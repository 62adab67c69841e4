"""The shared anchor bench (../shared/bench/anchor_models.py, or ANCHOR_MODELS) as a module, loaded by path
without importing ember: probes that time ember's import load it through this."""
import importlib.util
import os


def anchor():
    path = os.environ.get("ANCHOR_MODELS", os.path.join("..", "shared", "bench", "anchor_models.py"))
    spec = importlib.util.spec_from_file_location("anchor_models", path)
    am = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(am)
    return am
