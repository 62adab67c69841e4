"""The graph cache across processes (each a tests/runtime/graph_cache_child.py run: a small GPT block's
forward and backward through torch.compile): a second process loads what the first compiled, a damaged
cache is recompiled, concurrent processes share one cache."""
import json
import os
import subprocess
import sys

import torch

from ember.runtime import program_pickle
from ember.runtime.cache_dir import read_checked

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "graph_cache_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4


def _env(cache) -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    # the CI's backend and wrapper settings carry over from os.environ
    return dict(os.environ, EMBER_CACHE_DIR=str(cache), EMBER_GRAPH_CACHE="1", EMBER_FALLBACK_ON_ERROR="0",
                EMBER_COMPILE_PROFILE="0", PYTHONPATH=path)


def _start(cache, prefix, seed) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, str(prefix), str(seed)], env=_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, prefix) -> dict:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    with open(f"{prefix}.json") as f:
        result = json.load(f)
    result["tensors"] = torch.load(f"{prefix}.pt")
    assert result["eager_fallbacks"] == 0 and result["graphs"] == 2, result
    assert result["max_diff_from_eager"] < TOL, result["max_diff_from_eager"]
    return result


def _run(cache, prefix, seed) -> dict:
    return _finish(_start(cache, prefix, seed), prefix)


def _damage_every_file(root) -> int:
    damaged = 0
    for dirpath, _, names in os.walk(root):
        for i, name in enumerate(sorted(names)):
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                data = bytearray(f.read())
            if i % 2 and data:
                data[len(data) // 2] ^= 0x5A          # one byte changed
            else:
                data = data[: len(data) // 2]          # truncated
            with open(path, "wb") as f:
                f.write(bytes(data))
            damaged += 1
    return damaged


def test_second_process_loads_what_the_first_compiled_and_a_damaged_cache_recompiles(tmp_path):
    cache = tmp_path / "cache"
    cold = _run(cache, tmp_path / "cold", seed=1)
    assert cold["misses"] == 2 and cold["hits"] == 0
    warm = _run(cache, tmp_path / "warm", seed=2)
    assert warm["hits"] == 2 and warm["misses"] == 0 and warm["whole_graph_hits"] == 1
    # AOTAutograd's cache key is computed without inductor's code generators (whole_graph_cache._key_patches)
    generators = [m for m in warm["inductor_modules_imported"]
                  if m in ("torch._inductor.codegen.cpp", "torch._inductor.codegen.triton", "torch._inductor.lowering",
                           "torch._inductor.select_algorithm", "torch._inductor.decomposition")]
    assert not generators, generators
    assert warm["compile_seconds"] < cold["compile_seconds"] / 4, (warm["compile_seconds"], cold["compile_seconds"])
    assert warm["sources"] == cold["sources"]
    for a, b in zip(warm["tensors"], cold["tensors"]):
        assert torch.equal(a, b)

    assert _damage_every_file(cache) > 5
    again = _run(cache, tmp_path / "damaged", seed=3)      # correct and compiled: no eager fallback
    assert again["misses"] == 2 and again["hits"] == 0
    assert again["sources"] == cold["sources"]
    for a, b in zip(again["tensors"], cold["tensors"]):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_four_processes_compiling_one_graph_at_once(tmp_path):
    cache = tmp_path / "cache"
    procs = [(_start(cache, tmp_path / f"p{i}", seed=10 + i), tmp_path / f"p{i}") for i in range(4)]
    results = [_finish(p, prefix) for p, prefix in procs]
    for r in results[1:]:
        for a, b in zip(r["tensors"], results[0]["tensors"]):
            torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)
    entries = [n for _, _, names in os.walk(cache / "graphs") for n in names]
    assert len(entries) == 2, entries                  # one forward, one backward: no duplicates
    leftovers = [n for _, _, names in os.walk(cache) for n in names if n.endswith(".tmp")]
    assert not leftovers, leftovers
    for dirpath, _, names in os.walk(cache / "graphs"):     # whole entries, each of its own key
        for name in names:
            entry = program_pickle.loads(read_checked(os.path.join(dirpath, name)))
            assert entry["key"] == name and entry["program"].kernels()
