#!/usr/bin/env bash
# m14's GPU calls (tensor parallelism), everything packed into $OUT/call.tgz. One mode per device command:
#
#   one-gpu        (nvidia-h200, ~3 min): set m14-tp1: the float32 gate of m14 at tensor_parallel_size=1, with
#                  graphs and with enforce_eager, then the milestone before it against m14 TP=1 on the exact
#                  nanovllm, interleaved. TP=1 must be that milestone: the same tokens and the same speed.
#   two-gpus       (nvidia-h200-x2, ~8 min): set m14-tp2 on Qwen3-0.6B's shape: the gate of TP=2 (NCCL inside
#                  the graphs, and eager), TP=1 against TP=2 on single (batch 1) and nanovllm; the NCCL
#                  all-reduce latency at the step's sizes (allreduce_bench); the step probe of m14 at TP=2;
#                  the server with -tp 2 at a burst of the exact nanovllm, beside its offline generate.
#   two-gpus-8b    (nvidia-h200-x2, ~9 min): set m14-tp2-8b with --model qwen3-8b-random (m13's preset):
#                  batch 1 and nanovllm at TP 1 and 2, where a step reads 16 GB of weights.
#
#   OUT=/some/dir NANOSERVE_GIT_COMMIT=<sha> bash benchmarks/gpu_tp.sh one-gpu
#
# NVLink multicast stays off in everything started here (the lent hosts share their GPUs).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_MININTERVAL=15
OUT="${OUT:-/tmp/nanoserve-tp}"
MODE="${1:-}"
mkdir -p "$OUT"
"$PY" -c 'import torch; print("GPUs:", torch.cuda.device_count())' | tee "$OUT/gpus.log"
status=0
case "$MODE" in
    one-gpu)
        bash benchmarks/gpu_suite.sh --set m14-tp1 --budget-s 300 --out "$OUT/results" || status=1
        ;;
    two-gpus)
        bash benchmarks/gpu_suite.sh --set m14-tp2 --budget-s 280 --out "$OUT/results" || status=1
        "$PY" -m benchmarks.allreduce_bench --gpus 2 --out-dir "$OUT/allreduce" 2>&1 | tee "$OUT/allreduce.log" \
            || status=1
        "$PY" -m benchmarks.step_probe --milestone m14 --set tensor_parallel_size=2 --out-dir "$OUT/probe" 2>&1 \
            | tee "$OUT/probe.log" || status=1
        "$PY" -m benchmarks.online --milestone m14 -tp 2 --workload nanovllm --rates inf --offline-reference \
            --device cuda --no-progress --out-dir "$OUT/online" 2>&1 | tee "$OUT/online.log" || status=1
        ;;
    two-gpus-8b)
        bash benchmarks/gpu_suite.sh --model qwen3-8b-random --set m14-tp2-8b --budget-s 540 \
            --out "$OUT/results" || status=1
        ;;
    *)
        echo "usage: bash benchmarks/gpu_tp.sh one-gpu | two-gpus | two-gpus-8b" >&2
        exit 2
        ;;
esac
tar czf /tmp/nanoserve-call.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/nanoserve-call.tgz "$OUT/call.tgz"
exit $status
