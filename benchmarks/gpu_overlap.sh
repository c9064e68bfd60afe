#!/usr/bin/env bash
# One GPU call for the engine core (m11) and overlapped scheduling (m12), everything packed into $OUT/call.tgz:
#   1. the float32 gate and an interleaved comparison (gpu_suite.sh; sets or a/b:workload given as arguments)
#   2. the steady-state step probe (wall time against GPU-busy time, K/V bytes, host time per request)
#   3. the exact nanovllm served as a burst by m11 beside its offline generate (the server's wheels from .whl/)
#   OUT=/some/dir NANOSERVE_GIT_COMMIT=<sha> bash benchmarks/gpu_overlap.sh --set m10/m12:nanovllm --budget-s 240
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/nanoserve-overlap}"
PROBE="${PROBE_MILESTONES:-m10,m12}"
SERVE="${SERVE_MILESTONES:-m11}"
mkdir -p "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nanoserve-site .whl/*.whl \
    && export PYTHONPATH="/tmp/nanoserve-site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_MININTERVAL=15
status=0
bash benchmarks/gpu_suite.sh "$@" --out "$OUT/results" || status=1
[ -n "$PROBE" ] && { "$PY" -m benchmarks.step_probe --milestone "$PROBE" --out-dir "$OUT/probe" 2>&1 | tee "$OUT/probe.log" || status=1; }
[ -n "$SERVE" ] && { "$PY" -m benchmarks.online --milestone "$SERVE" --workload nanovllm --rates inf --offline-reference \
    --device cuda --no-progress --out-dir "$OUT/online" 2>&1 | tee "$OUT/online.log" || status=1; }
tar czf /tmp/nanoserve-call.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/nanoserve-call.tgz "$OUT/call.tgz"
exit $status
