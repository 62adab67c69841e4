#!/usr/bin/env bash
# Everything to check on a GPU machine, in one command that fits a 10-minute run:
#     bash scripts/gpu_check.sh                                        # every default step, one GPU
#     GPU_CHECK_STEPS="overhead models_small anchor" bash scripts/gpu_check.sh     # only these steps
#     bash scripts/gpu_check.sh --two-gpus "tests variants" "dynamic kernels anchor memory"
#     bash scripts/gpu_check.sh --two-gpus models_vision models_text   # the six-model benchmark, 3 per GPU
# Default steps: tests model_step demo overhead models_small kernels anchor dynamic variants memory
# compile_time. Steps run only when named: models_vision, models_text (ResNet-50, ViT, ConvNeXt / BERT,
# GPT-2, Llama; ~4-5 min each). GPU_CHECK_STEPS=none runs only the set-up (install, versions).
# Logs and JSON results go to $OUT (./gpu_check_out when unset); --two-gpus runs the two step lists side by
# side, one per GPU, with logs in $OUT/gpu0 and $OUT/gpu1, packed into $OUT/gpu_check.tgz (the two sides
# share the host's CPUs: host-bound benchmarks read a little slower than alone). Each step has its own time
# limit and the whole run stays under GPU_CHECK_BUDGET_S (540 s); a failing or timed-out step is recorded in
# $OUT/summary.txt and the next step still runs. The anchor step runs anchor_kernels.py from $ANCHOR_DIR, else
# the first of shared/bench, .devbench, ../shared/bench that has it.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
# The device machines have no network: no build isolation (it would fetch setuptools), and PYTHONPATH makes
# this checkout the ember every step imports even if the editable install fails.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi

if [ "${1:-}" = "--two-gpus" ]; then
    mkdir -p "$OUT/gpu0" "$OUT/gpu1"
    [ -z "${GPU_CHECK_NO_INSTALL:-}" ] && python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
    for side in 0 1; do
        steps=$([ $side = 0 ] && echo "${2:-tests}" || echo "${3:-dynamic}")
        CUDA_VISIBLE_DEVICES=$side OUT="$OUT/gpu$side" GPU_CHECK_STEPS="$steps" GPU_CHECK_NO_INSTALL=1 \
            bash "$0" > "$OUT/gpu$side/gpu_check.log" 2>&1 &
    done
    wait
    tar czf "$OUT/gpu_check.tgz" -C "$OUT" gpu0 gpu1
    for side in 0 1; do
        echo "=============== GPU $side"
        grep -v "^{" "$OUT/gpu$side/gpu_check.log" | tail -60
    done
    exit 0
fi

mkdir -p "$OUT"
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
OPTIONAL_STEPS=" models_vision models_text "
: > "$OUT/summary.txt"

# selected NAME: whether this run includes step NAME
selected() {
    [ "$1" = install ] || [ "$1" = versions ] && return 0
    [ -n "${GPU_CHECK_STEPS:-}" ] && { [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; return; }
    [[ "$OPTIONAL_STEPS" != *" $1 "* ]]
}

# step NAME LIMIT_S CMD...: run CMD with stdout+stderr teed to $OUT/NAME.log, never longer than LIMIT_S
# nor past the overall budget; record its exit status.
step() {
    local name=$1 limit=$2
    shift 2
    selected "$name" || return 0
    local left=$((BUDGET - SECONDS - 5))
    if [ "$left" -lt 20 ]; then
        echo "=== $name: skipped, time budget spent" | tee -a "$OUT/summary.txt"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS rc
    (set -o pipefail; timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log")
    rc=$?
    local verdict="ok"
    [ "$rc" -ne 0 ] && verdict="FAILED (exit $rc)"
    [ "$rc" -eq 124 ] && verdict="TIMED OUT after ${limit}s"
    echo "=== $name: $verdict in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
    return 0
}

[ -z "${GPU_CHECK_NO_INSTALL:-}" ] && step install 120 python -m pip install --no-deps --no-build-isolation -e . -q
step versions 60 python -c "
import torch, triton, platform
print('python', platform.python_version(), '| torch', torch.__version__, '| triton', triton.__version__)
print('cuda available:', torch.cuda.is_available(), '| cuda', torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('gpu:', torch.cuda.get_device_name(), f'| {p.total_memory / 2**30:.0f} GiB | sm_{p.major}{p.minor}')
"
command -v nvidia-smi > /dev/null && \
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$OUT/nvidia-smi.log"

# xdist when present: the tests are compile-bound (CPU), so workers help even on one GPU
XDIST=""
python -c "import xdist" 2>/dev/null && XDIST="-n 8"
if ! selected tests; then
    :
elif python -c "import pytest" 2>/dev/null; then
    # -v names each test as it ends; a test hanging for EMBER_TEST_HANG_S prints its stack and is ended
    EMBER_TEST_DEVICE=cuda EMBER_TEST_HANG_S=120 EMBER_TEST_HANG_DIR="$OUT" EMBER_COMPILE_WORKERS=2 \
        step tests 300 python -m pytest -v -rfE -p no:randomly $XDIST tests
    cat "$OUT"/hang_*.log 2>/dev/null | tee "$OUT/tests_hangs.log" | head -80
else
    echo "=== tests: skipped, pytest is not installed on this machine" | tee -a "$OUT/summary.txt"
fi
# ConvNeXt's training step holds the column reductions that once hit a Triton fault at one launch config
# (heuristics.FAULTING_COLUMN_CONFIG; experiments/triton_misaligned_repro.py)
CUDA_LAUNCH_BLOCKING=1 EMBER_DEBUG_SYNC=1 step model_step 240 python -m scripts.debug_model_step convnext --mode train
step demo 90 python -m ember.cli demo --device cuda
step overhead 60 python -m benchmarks.overhead --profile
step models_small 150 python -m benchmarks.models --small --modes train --backends eager,ember --models gpt2,bert,llama,vit
step kernels 150 python -m benchmarks.kernels --backends eager,inductor,ember --out "$OUT/kernels.json"
ANCHOR=""
for dir in ${ANCHOR_DIR:-} shared/bench .devbench ../shared/bench; do
    [ -f "$dir/anchor_kernels.py" ] && ANCHOR="$dir/anchor_kernels.py" && break
done
if [ -n "$ANCHOR" ]; then
    step anchor 150 python "$ANCHOR" --backends eager,inductor,ember --out "$OUT/anchor.json"
elif selected anchor; then
    echo "=== anchor: skipped, no anchor_kernels.py found (set ANCHOR_DIR)" | tee -a "$OUT/summary.txt"
fi
step dynamic 240 python -m benchmarks.dynamic --models gpt2,bert --seqs 128,384,512,1000 --out "$OUT/dyn.json"
step variants 200 sh -c "python -m scripts.debug_model_step bert --small --variants && python -m scripts.debug_model_step gpt2 --small --variants"
step memory 150 python -m benchmarks.memory --models gpt2 --modes infer,train
step compile_time 200 python -m scripts.compile_time --models gpt2 --modes train --workers 0,16
step models_vision 520 python -m benchmarks.models --models resnet50,vit,convnext --budget-s 0 --json "$OUT/models_vision.json"
step models_text 520 python -m benchmarks.models --models bert,gpt2,llama --budget-s 0 --json "$OUT/models_text.json"

echo
echo "=== summary ($SECONDS s in all; logs in $OUT)"
cat "$OUT/summary.txt"
