"""Data parallelism with ember, on 2 CPU ranks with gloo: DDP (its bucketed all-reduces run between
ember's graphs) and FSDP2 (`fully_shard` per block and on the root; its hooks gather and reduce-scatter
around ember's graphs), compiled per block and whole. Losses and parameters after the steps equal eager's."""
import pytest

from spawn_ranks import check_ran, requires_gloo, run_ranks

pytestmark = requires_gloo

SCENARIOS = ["ddp", "fsdp"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(SCENARIOS, tmp_path_factory.mktemp("data_parallel"))


def _check(ranks):
    check_ran(ranks)
    for r in ranks:
        assert r["eager_fallbacks"] == 0 and r["graphs"] > 0, r
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, r
    # each rank trains on batches of its own and the ranks average their gradients: the (full) parameters
    # are the same on every rank
    assert len(ranks[0]["losses"]) == 3
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-6)


def test_ddp_mlp_trains_as_eager(results):
    _check(results["ddp"])


def test_fsdp2_blocks_train_as_eager(results):
    _check(results["fsdp"])
