"""Data parallelism with ember, on 2 CPU ranks with gloo: DDP (its bucketed all-reduces run between
ember's graphs; with compiled autograd and DDP's python reducer, inside ember's backward graph) and FSDP2 (`fully_shard` per block and on the root; its hooks gather and reduce-scatter
around ember's graphs), compiled per block and whole. Losses and parameters after the steps equal eager's."""
import pytest

from spawn_ranks import check_compiled, requires_gloo, results_fixture

pytestmark = requires_gloo
results = results_fixture(["ddp", "ddp_compiled_autograd", "fsdp"])


def _check(ranks):
    check_compiled(ranks)
    for r in ranks:
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, r
    # each rank trains on batches of its own and the ranks average their gradients: the (full) parameters
    # are the same on every rank
    assert len(ranks[0]["losses"]) == 5
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-6)


def test_ddp_split_at_buckets_trains_as_eager(results):
    ranks = results["ddp"]
    _check(ranks)
    # Dynamo's DDP optimizer splits the graph at the bucket boundaries: a forward and a backward graph each
    assert all(r["graphs"] >= 4 for r in ranks), ranks


def test_ddp_under_compiled_autograd_all_reduces_in_ember_graphs(results):
    ranks = results["ddp_compiled_autograd"]
    _check(ranks)
    for r in ranks:
        # the four gradients' all-reduces are bucketed into one, which reduces its concatenation in place
        assert r["collectives_bucketed"] == 4 and r["collectives"]["_c10d_functional.all_reduce_.default"] == 1, r
        assert "_c10d_functional.all_reduce.default" not in r["collectives"], r["collectives"]


def test_fsdp2_blocks_train_as_eager(results):
    _check(results["fsdp"])
