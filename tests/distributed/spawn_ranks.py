"""Run a tests/distributed/ranks.py scenario in one process per rank (CPU, gloo) and collect what each
rank wrote. A rank that runs past `timeout` seconds is killed, and the test fails naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gloo_available() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


requires_gloo = pytest.mark.skipif(not gloo_available(), reason="torch.distributed with gloo is not available")


def run_ranks(scenarios: list, tmp_path, world: int = 2, timeout: float = 240.0) -> dict:
    """scenario -> [each rank's result]."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    # one OpenMP thread per rank: the ranks share the machine's cores
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", EMBER_QUIET="1")
    store = tmp_path / "store"
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, RANKS, ",".join(scenarios), str(r), str(world), str(store),
                               str(outs[r])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    logs = []
    for r, p in enumerate(procs):
        try:
            logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenarios}: rank {r} ran past {timeout:.0f} s")
    by_rank = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and out.exists(), f"rank {r} failed:\n{logs[r][-4000:]}"
        by_rank.append(json.loads(out.read_text()))
    return {name: [results.get(name, {"error": "not run: an earlier scenario failed"}) for results in by_rank]
            for name in scenarios}


def check_ran(results: list) -> None:
    """Every rank ran the scenario to its end."""
    for r, result in enumerate(results):
        assert "error" not in result, f"rank {r}:\n{result['error']}"
