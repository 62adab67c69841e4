"""Collectives inside ember's graphs, on 2 CPU ranks with gloo: functional collectives called in a
compiled function, and tensor parallelism (DTensor traces its collectives into the graphs). Each runs
as ember wrapper calls, not ATen fallbacks, and gives eager's values on every rank."""
import pytest

from spawn_ranks import check_ran, requires_gloo, run_ranks

pytestmark = requires_gloo

SCENARIOS = ["funcol", "tensor_parallel"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(SCENARIOS, tmp_path_factory.mktemp("collectives"))


def _compiled_without_fallbacks(results):
    check_ran(results)
    for r in results:
        assert r["eager_fallbacks"] == 0 and r["graphs"] > 0, r
        assert not [op for op in r["fallbacks"] if "c10d" in op], r["fallbacks"]


def test_functional_collectives_in_a_compiled_function(results):
    ranks = results["funcol"]
    _compiled_without_fallbacks(ranks)
    for r in ranks:
        assert r["diff"] < 1e-5, r
        names = " ".join(r["collectives"])
        for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
                   "wait_tensor"):
            assert op in names, r["collectives"]


def test_tensor_parallel_mlp_trains_as_eager(results):
    ranks = results["tensor_parallel"]
    _compiled_without_fallbacks(ranks)
    for r in ranks:
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, r
        assert any("all_reduce" in op for op in r["collectives"]), r["collectives"]
    assert ranks[0]["losses"] == pytest.approx(ranks[1]["losses"], rel=1e-6)
