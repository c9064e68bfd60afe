#!/usr/bin/env bash
# One GPU call for the engine core (m11) and overlapped scheduling (m12), everything packed into $OUT/call.tgz:
#   1. the float32 gate and interleaved comparisons (gpu_suite.sh; sets or a/b:workload given as arguments)
#   2. PROBE_MILESTONES: the steady-state step probe (wall time against GPU-busy time, K/V bytes, host time)
#   3. SERVE_MILESTONES with SERVE_ARGS: served under streaming load (benchmarks.online; default: the exact
#      nanovllm as a burst beside the engine's offline generate), SERVE_ROUNDS times in turn (default once);
#      PROFILE_SERVE=1: each served run under py-spy (its wheel carried in .whl/), every process sampled, one raw
#      flame file per run under profile/
# A variable set to "" skips its part. The server's wheels come from .whl/ (AGENTS.md, "A GPU call").
#   OUT=/some/dir NANOSERVE_GIT_COMMIT=<sha> bash benchmarks/gpu_overlap.sh --set m10-m12-nanovllm --budget-s 240
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
OUT="${OUT:-/tmp/nanoserve-overlap}"
PROBE="${PROBE_MILESTONES-m10,m12}"
SERVE="${SERVE_MILESTONES-m11}"
SERVE_ARGS="${SERVE_ARGS:---workload nanovllm --rates inf --offline-reference}"
mkdir -p "$OUT"
status=0
[ $# -gt 0 ] && { bash benchmarks/gpu_suite.sh "$@" --out "$OUT/results" || status=1; }
[ -n "$PROBE" ] && { "$PY" -m benchmarks.step_probe --milestone "$PROBE" --out-dir "$OUT/probe" 2>&1 | tee "$OUT/probe.log" || status=1; }
# SERVE_ROUNDS=N (default 1) serves the milestones in turn N times (A, B, A, B, ...), each server started afresh, every
# round's files under online/round-K/: a ratio between two servers is then the median of per-round ratios.
ROUNDS="${SERVE_ROUNDS:-1}"
if [ -n "$SERVE" ]; then
    for round in $(seq 1 "$ROUNDS"); do
        for milestone in ${SERVE//,/ }; do
            dir="$OUT/online"; [ "$ROUNDS" -gt 1 ] && dir="$OUT/online/round-$round"
            profiler=()
            [ "${PROFILE_SERVE:-}" = 1 ] && mkdir -p "$OUT/profile" && profiler=(/tmp/nanoserve-site/bin/py-spy record
                --nonblocking --subprocesses --threads --rate 200 --format raw -o "$OUT/profile/$milestone-round-$round.raw" --)
            # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
            "${profiler[@]}" "$PY" -m benchmarks.online --milestone "$milestone" $SERVE_ARGS --device cuda --no-progress \
                --out-dir "$dir" 2>&1 | tee -a "$OUT/online.log" || status=1
            # what a round leaves behind: kernels compiled so far (Triton's disk cache), processes still alive
            echo "after $milestone round $round: $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name '*.cubin' \
                2>/dev/null | wc -l) cubins cached, $(pgrep -c -f 'benchmarks\.online|multiprocessing') benchmark processes left" \
                | tee -a "$OUT/online.log"
        done
    done
fi
tar czf /tmp/nanoserve-call.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/nanoserve-call.tgz "$OUT/call.tgz"
exit $status
