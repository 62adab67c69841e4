"""benchmarks/distributed_train.py on 2 CPU ranks with gloo, the smoke configuration: a Llama-style model
under FSDP2 and under FSDP2 x tensor parallel (blocks, head and optimizer step compiled), eager and ember, the same losses in fp32
with every graph compiled by ember; and the trace analysis that measures NCCL overlap, on a made-up trace."""
import json
import os

from spawn_ranks import ROOT, requires_gloo, run_script

from benchmarks.distributed_train import nccl_overlap

SMOKE = ["--device", "cpu", "--layers", "2", "--dim", "64", "--seq", "32", "--vocab", "512",
         "--parallel", "fsdp,fsdp_tp", "--backends", "eager,ember", "--steps", "3", "--warmup", "1",
         # the blocks, and the head with its loss as a function of its own
         "--compile", "blocks+head", "--compile-optimizer",
         # one batch repeated: a parameter updated wrongly at step 0 changes the loss of step 1
         "--distinct-batches", "1"]


@requires_gloo
def test_smoke_config_trains_as_eager_with_ember(tmp_path):
    done = run_script(os.path.join(ROOT, "benchmarks", "distributed_train.py"), SMOKE + ["--out", str(tmp_path)])
    for r, (code, log) in enumerate(done):
        assert code == 0, f"rank {r}:\n{log[-4000:]}"
    runs = {(run["parallel"], run["backend"]): run
            for run in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert set(runs) == {(p, b) for p in ("fsdp", "fsdp_tp") for b in ("eager", "ember")}, runs
    for parallel in ("fsdp", "fsdp_tp"):
        eager, ember_run = runs[(parallel, "eager")], runs[(parallel, "ember")]
        assert "error" not in ember_run, ember_run.get("error")
        assert len(ember_run["losses"]) == 3 and ember_run["losses"][1] != eager["losses"][0]
        assert ember_run["max_loss_diff"] < 1e-5, (ember_run["losses"], eager["losses"])
        assert ember_run["ember_no_fallback"], ember_run["ember"]
        assert ember_run["tokens_per_s"] > 0 and ember_run["first_call_s"] > 0
        # a block's forward and backward, shared by the blocks, the head's, and the AdamW step's
        assert all(c["graphs_compiled"] == 5 for c in ember_run["ember"]), ember_run["ember"]
        assert ember_run["compiled_optimizer"]
    # the head's linear and cross-entropy become one chunked op under FSDP (the tensor-parallel head gathers
    # its logits between them, and is left as it is)
    assert all(c["linear_cross_entropy_rewrites"] == 1 for c in runs[("fsdp", "ember")]["ember"])
    assert all(c["linear_cross_entropy_rewrites"] == 0 for c in runs[("fsdp_tp", "ember")]["ember"])
    # tensor parallelism's all-reduces are traced into the compiled blocks
    for counts in runs[("fsdp_tp", "ember")]["ember"]:
        assert counts["collectives"].get("_c10d_functional.all_reduce_.default", 0) > 0, counts


def _kernel(name, ts, dur, stream, device=0):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": device, "tid": stream,
            "args": {"stream": stream, "device": device}}


def test_nccl_overlap_counts_compute_on_other_streams_only():
    trace = {"traceEvents": [
        _kernel("ncclDevKernel_AllGather_RING_LL", 100, 100, stream=20),    # [100, 200]
        _kernel("ampere_sgemm", 50, 100, stream=7),                         # covers [100, 150]
        _kernel("triton_poi_fused_add", 140, 30, stream=7),                 # [140, 170]: overlaps the gemm
        _kernel("triton_red_fused_sum", 180, 10, stream=20),                # same stream as the NCCL kernel
        _kernel("other_device_gemm", 100, 100, stream=7, device=1),         # another device
        _kernel("ncclDevKernel_ReduceScatter", 300, 50, stream=20),         # nothing runs beside it
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
    ]}
    summary = nccl_overlap(trace)
    assert summary["nccl_kernels"] == 2 and summary["nccl_us"] == 150
    assert summary["overlap_fraction"] == 70 / 150       # [100, 170] of the first; none of the second
    assert summary["exposed_nccl_us"] == 80
    assert summary["compute_by_kind_us"] == {"gemm": 200, "other": 40}
    assert summary["top_kernels_us"][0][1:] == [100, 1] and summary["span_us"] == 300   # [50, 350]
    assert nccl_overlap({"traceEvents": []})["overlap_fraction"] is None


@requires_gloo
def test_interleaved_backends_train_as_they_do_alone(tmp_path):
    """--interleave: eager's and ember's models live in one process and take their steps in turn; each still
    trains on its own batches to the same losses (a step of one must not touch the other's state)."""
    args = SMOKE[:SMOKE.index("--parallel")] + [
        "--parallel", "fsdp", "--backends", "eager,ember", "--steps", "3", "--warmup", "1", "--compile", "blocks",
        "--distinct-batches", "1", "--interleave", "--out", str(tmp_path)]
    done = run_script(os.path.join(ROOT, "benchmarks", "distributed_train.py"), args)
    for r, (code, log) in enumerate(done):
        assert code == 0, f"rank {r}:\n{log[-4000:]}"
    runs = {run["backend"]: run for run in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert set(runs) == {"eager", "ember"} and all(run.get("interleaved") for run in runs.values()), runs
    assert runs["ember"]["losses"][1] != runs["eager"]["losses"][0]
    assert runs["ember"]["max_loss_diff"] < 1e-5, (runs["ember"]["losses"], runs["eager"]["losses"])
    assert runs["ember"]["ember_no_fallback"], runs["ember"]["ember"]
