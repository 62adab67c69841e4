"""Start one process per rank (CPU, gloo): tests/distributed/ranks.py scenarios, collecting what each rank
wrote, or a script launched as torchrun launches it. A rank that runs past `timeout` seconds is killed
(all ranks are), and the test fails naming it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Optional

import pytest

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gloo_available() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


requires_gloo = pytest.mark.skipif(not gloo_available(), reason="torch.distributed with gloo is not available")


def _env(**extra) -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    # one OpenMP thread per rank: the ranks share the machine's cores
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", EMBER_QUIET="1", **extra)


def run_processes(commands: list, envs: list, timeout: float, what: str) -> list:
    """Start one process per rank, wait for all -> [(return code, output)] per rank."""
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in zip(commands, envs)]
    deadline = time.monotonic() + timeout
    logs = []
    for r, p in enumerate(procs):
        try:
            logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.communicate()
            pytest.fail(f"{what}: rank {r} ran past {timeout:.0f} s")
    return [(p.returncode, log) for p, log in zip(procs, logs)]


def run_script(script: str, args: list, world: int = 2, timeout: float = 240.0, env: Optional[dict] = None) -> list:
    """A script launched as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT), with `env` added to the
    environment -> [(code, output)]."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    envs = [_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {})) for r in range(world)]
    return run_processes([[sys.executable, script, *args]] * world, envs, timeout, script)


def run_ranks(scenarios: list, tmp_path, world: int = 2, timeout: float = 240.0) -> dict:
    """scenario -> [each rank's result]."""
    store = tmp_path / "store"
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    commands = [[sys.executable, RANKS, ",".join(scenarios), str(r), str(world), str(store), str(outs[r])]
                for r in range(world)]
    done = run_processes(commands, [_env()] * world, timeout, ",".join(scenarios))
    by_rank = []
    for r, ((code, log), out) in enumerate(zip(done, outs)):
        assert code == 0 and out.exists(), f"rank {r} failed:\n{log[-4000:]}"
        by_rank.append(json.loads(out.read_text()))
    return {name: [results.get(name, {"error": "not run: an earlier scenario failed"}) for results in by_rank]
            for name in scenarios}


def results_fixture(scenarios: list):
    """A module-scoped fixture: scenario -> [each rank's result], the scenarios run once for the module."""
    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        return run_ranks(scenarios, tmp_path_factory.mktemp("ranks"))
    return results


def check_compiled(results: list) -> None:
    """Every rank ran the scenario to its end, compiled its graphs with ember (no graph ran eagerly),
    and ran no collective as an ATen fallback."""
    for r, result in enumerate(results):
        assert "error" not in result, f"rank {r}:\n{result['error']}"
        assert result["eager_fallbacks"] == 0 and result["graphs"] > 0, result
        assert not [op for op in result["fallbacks"] if "c10d" in op], result["fallbacks"]
