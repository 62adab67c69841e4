"""On 2 CPU ranks with gloo: bucketed collectives (graph/passes/bucket_collectives.py) give eager's values;
a graph one rank cannot compile runs eagerly on both (runtime/rank_agreement.py); a collective whose
shapes differ across ranks ends in torch's error, not a hang."""
import sys
import time

from spawn_ranks import RANKS, _env, requires_gloo, results_fixture, run_processes

pytestmark = requires_gloo
results = results_fixture(["bucketed", "rank_agreement"])


def test_bucketed_collectives_compute_eagers_values(results):
    for r in results["bucketed"]:
        assert "error" not in r, r["error"]
        assert r["diff"] < 1e-5 and r["eager_fallbacks"] == 0, r
        # all_reduce (sum) x3, all_gather x2, reduce_scatter x2 bucketed: the max and the dependent all_reduce
        # not; each all-reduce's input (the bucket's concatenation among them) dies with it: reduced in place
        assert r["collectives_bucketed"] == 7, r
        assert r["collectives"]["_c10d_functional.all_reduce_.default"] == 3, r["collectives"]
        assert "_c10d_functional.all_reduce.default" not in r["collectives"], r["collectives"]
        assert r["collectives"]["_c10d_functional.all_gather_into_tensor.default"] == 1, r["collectives"]
        assert r["collectives"]["_c10d_functional.reduce_scatter_tensor.default"] == 1, r["collectives"]


def test_a_graph_one_rank_cannot_compile_runs_eagerly_on_every_rank(results):
    for r in results["rank_agreement"]:
        assert "error" not in r, r["error"]
        assert r["diff"] < 1e-6 and r["eager_fallbacks"] == 1, r
        assert len(r["warnings"]) == 1, r["warnings"]
    own, other = (r["warnings"][0] for r in results["rank_agreement"][::-1])
    assert "lowering of sin fails" in own and "another rank failed to compile" in other


def test_mismatched_shapes_raise_torchs_error(tmp_path):
    commands = [[sys.executable, RANKS, "mismatched_shapes", str(r), "2", str(tmp_path / "store"),
                 str(tmp_path / f"rank{r}.json")] for r in range(2)]
    start = time.monotonic()
    done = run_processes(commands, [_env()] * 2, 45, "mismatched_shapes")
    assert time.monotonic() - start < 40
    logs = "\n".join(log + (open(tmp_path / f"rank{r}.json").read() if (tmp_path / f"rank{r}.json").exists() else "")
                     for r, (_, log) in enumerate(done))
    # gloo checks the sizes it receives: one rank stops on the mismatch, the other's connection is reset
    assert "doesn't match expected size" in logs, logs[-4000:]
    assert all(code != 0 or "error" in open(tmp_path / f"rank{r}.json").read() for r, (code, _) in enumerate(done))
