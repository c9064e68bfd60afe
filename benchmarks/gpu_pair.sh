#!/usr/bin/env bash
# One call on a two-GPU machine (nvidia-h200-x2): two suite processes side by side, one per GPU.
#
#   bash benchmarks/gpu_pair.sh --budget-s 560 m04-m06-nanovllm,m03-m06-offline m09-m10   # GPU 0, then GPU 1
#   bash benchmarks/gpu_pair.sh --budget-s 560 m07-budgets,m06-m08-offline m09-m10
#
# Each process sees one GPU (CUDA_VISIBLE_DEVICES), runs its own float32 gate and its own interleaved
# comparisons, and writes $OUT/gpu0/ or $OUT/gpu1/ (suite.json, summary.md, suite.log) as gpu_suite.sh does.
# A ratio therefore never mixes the two GPUs; the two halves share the host's CPUs (32 cores, ample for two
# launch-bound Python processes). Both halves come back in $OUT/pair.tgz. Back home, unpack each half:
#   tar xzf <fetched>/pair.tgz -C /tmp/pair
#   python -m benchmarks.gpu_suite --unpack /tmp/pair/gpu0/suite.json
#   python -m benchmarks.gpu_suite --unpack /tmp/pair/gpu1/suite.json
set -uo pipefail
cd "$(dirname "$0")/.."
budget=(); extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) budget=(--budget-s "$2"); shift 2 ;;
        --*) extra+=("$1"); shift ;;
        *) break ;;
    esac
done
if [ $# -ne 2 ]; then
    echo "usage: bash benchmarks/gpu_pair.sh [--budget-s S] [suite flags] SETS_FOR_GPU0 SETS_FOR_GPU1" >&2
    exit 2
fi
OUT="${OUT:-/tmp/nanoserve-pair}"
status=0
pids=()
for gpu in 0 1; do
    sets="$([ "$gpu" = 0 ] && echo "$1" || echo "$2")"
    mkdir -p "$OUT/gpu$gpu"
    CUDA_VISIBLE_DEVICES="$gpu" OUT="$OUT/gpu$gpu" bash benchmarks/gpu_suite.sh --set "$sets" \
        "${budget[@]}" "${extra[@]}" > "$OUT/gpu$gpu/console.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for gpu in 0 1; do
    echo "================ GPU $gpu: $([ "$gpu" = 0 ] && echo "$1" || echo "$2")"
    cat "$OUT/gpu$gpu/summary.md" 2>/dev/null || tail -n 40 "$OUT/gpu$gpu/console.log"
done
# The device tool returns at most 8 files from $OUT: everything travels in one archive.
(cd "$OUT" && tar czf pair.tgz gpu0 gpu1 && rm -rf gpu0 gpu1)
exit $status
