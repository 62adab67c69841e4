#!/usr/bin/env bash
# gpu_check.sh on a machine of two GPUs: two step lists run side by side, one per GPU, so a device call
# does twice the work in the same minutes (through the device tool, kind nvidia-h200-x2):
#     bash scripts/gpu_check_x2.sh "tests grad_variants" "dynamic kernels anchor memory"
#     MODELS_SPLIT=1 bash scripts/gpu_check_x2.sh          # the six-model benchmark, three models per GPU
# Each side's logs go to $OUT/gpu0 and $OUT/gpu1; everything is also packed into $OUT/gpu_check.tgz
# (the device tool returns at most 8 files). The two sides share the host's CPUs: benchmarks that are
# bound by host time (small kernels) read a little slower than alone.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT/gpu0" "$OUT/gpu1"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
export GPU_CHECK_NO_INSTALL=1
if [ -n "${MODELS_SPLIT:-}" ]; then
    budget="${MODELS_BUDGET_S:-520}"
    for side in 0 1; do
        models=$([ $side = 0 ] && echo "resnet50,vit,convnext" || echo "bert,gpt2,llama")
        (CUDA_VISIBLE_DEVICES=$side timeout -k 10 "$budget" python benchmarks/models.py \
            --models "$models" --budget-s 0 --json "$OUT/gpu$side/models.json" > "$OUT/gpu$side/models.log" 2>&1) &
    done
else
    for side in 0 1; do
        steps=$([ $side = 0 ] && echo "${1:-tests}" || echo "${2:-dynamic}")
        CUDA_VISIBLE_DEVICES=$side OUT="$OUT/gpu$side" GPU_CHECK_STEPS="$steps" bash scripts/gpu_check.sh \
            > "$OUT/gpu$side/gpu_check.log" 2>&1 &
    done
fi
wait
tar czf "$OUT/gpu_check.tgz" -C "$OUT" gpu0 gpu1
for side in 0 1; do
    echo "=============== GPU $side"
    if [ -n "${MODELS_SPLIT:-}" ]; then
        if grep -q "^model " "$OUT/gpu$side/models.log"; then
            sed -n '/^model /,$p' "$OUT/gpu$side/models.log"
        else
            tail -30 "$OUT/gpu$side/models.log"       # stopped before its table: the rows it printed
        fi
    else
        grep -v "^{" "$OUT/gpu$side/gpu_check.log" | tail -60
    fi
done
