#!/usr/bin/env bash
# One GPU call comparing two trees under the same served benchmark, in interleaved rounds: A is OLD_TREE (an
# earlier commit's milestones/ and benchmarks/, unpacked with `git archive`), B this checkout; A, B, A, B, ...
# ROUNDS times, each round a fresh `benchmarks.online` (its own server and engines), every file under
# $OUT/online/{a,b}/round-K/, everything packed into $OUT/call.tgz. Arguments go to gpu_suite.sh first (the
# float32 gate and any sets). The server's wheels come from .whl/ (AGENTS.md, "A GPU call").
#   git archive <sha> milestones benchmarks/*.py | tar -x -C .ab/old     # here, with .ab/ in .git/info/exclude
#   OUT=/some/dir OLD_TREE=.ab/old OLD_COMMIT=<sha> NANOSERVE_GIT_COMMIT=<this sha> ROUNDS=2 SERVE_ARGS='--workload offline ...' \
#       bash benchmarks/gpu_ab_online.sh --set m11:offline
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
OUT="${OUT:-/tmp/nanoserve-ab}"
OLD_TREE="$(realpath "${OLD_TREE:?OLD_TREE: the tree to compare this checkout with}")"
MILESTONE="${SERVE_MILESTONE:-m11}"
mkdir -p "$OUT"
status=0
[ $# -gt 0 ] && { bash benchmarks/gpu_suite.sh "$@" --out "$OUT/results" || status=1; }
for round in $(seq 1 "${ROUNDS:-2}"); do
    for side in a b; do
        tree="$PWD" commit="${NANOSERVE_GIT_COMMIT:-}"
        [ "$side" = a ] && tree="$OLD_TREE" commit="${OLD_COMMIT:-}"
        # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
        (cd "$tree" && NANOSERVE_GIT_COMMIT="$commit" "$PY" -m benchmarks.online --milestone "$MILESTONE" $SERVE_ARGS --device cuda --no-progress \
            --out-dir "$OUT/online/$side/round-$round") 2>&1 | sed "s/^/[$side $round] /" | tee -a "$OUT/online.log" \
            || status=1
        echo "[$side $round] done: $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name '*.cubin' 2>/dev/null \
            | wc -l) cubins cached, $(pgrep -c -f 'benchmarks\.online|multiprocessing') benchmark processes left" \
            | tee -a "$OUT/online.log"
    done
done
tar czf /tmp/nanoserve-call.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/nanoserve-call.tgz "$OUT/call.tgz"
exit $status
