"""Collectives inside ember's graphs, on 2 CPU ranks with gloo: functional collectives called in a
compiled function, and tensor parallelism, colwise / rowwise and sequence parallel (DTensor traces its
collectives into the graphs). Each runs as ember wrapper calls, not ATen fallbacks, and gives eager's
values on every rank."""
import pytest

from spawn_ranks import check_compiled, requires_gloo, results_fixture

pytestmark = requires_gloo
results = results_fixture(["funcol", "tensor_parallel", "sequence_parallel"])


def test_functional_collectives_in_a_compiled_function(results):
    ranks = results["funcol"]
    check_compiled(ranks)
    for r in ranks:
        assert r["diff"] < 1e-5 and r["input_kept"], r
        names = " ".join(r["collectives"])
        for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
                   "wait_tensor"):
            assert op in names, r["collectives"]
        # x * 2 dies with its all-reduce (in place); x @ y.T is read again and y is the caller's
        assert r["collectives"]["_c10d_functional.all_reduce_.default"] == 1, r["collectives"]
        assert r["collectives"]["_c10d_functional.all_reduce.default"] == 2, r["collectives"]


def test_tensor_parallel_mlp_trains_as_eager(results):
    ranks = results["tensor_parallel"]
    check_compiled(ranks)
    for r in ranks:
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, r
        assert any("all_reduce" in op for op in r["collectives"]), r["collectives"]
    assert ranks[0]["losses"] == pytest.approx(ranks[1]["losses"], rel=1e-6)


def test_sequence_parallel_trains_as_eager(results):
    ranks = results["sequence_parallel"]
    check_compiled(ranks)
    for r in ranks:
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, r
        names = " ".join(r["collectives"])
        assert "all_gather_into_tensor" in names and "reduce_scatter_tensor" in names, r["collectives"]
    # each rank holds its part of the sequence: its own losses, the same (replicated) parameters
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-6)
