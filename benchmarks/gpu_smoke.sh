#!/usr/bin/env bash
# Every GPU benchmark tool once, briefly: after a change to benchmarks/, does each GPU path still run? (~7 min)
# The float32 gate runs first (gpu_suite's smoke set); nothing here is a figure to quote. Each tool has its own
# timeout and log; the exit status is non-zero if any failed.
#   OUT=/some/dir NANOSERVE_GIT_COMMIT=<sha> bash benchmarks/gpu_smoke.sh    # -> $OUT/smoke.tgz
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
OUT="${OUT:-/tmp/nanoserve-smoke}"
W="$OUT/smoke"
mkdir -p "$W"
status=0
run() {  # run NAME SECONDS COMMAND...: the command's output to NAME.log, its exit status and last lines printed
    local name=$1 seconds=$2
    shift 2
    timeout "$seconds" "$@" > "$W/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc"; tail -n 2 "$W/$name.log"
    [ $rc -eq 0 ] || status=1
}
OUT="$W/suite" run suite 200 "$PY" -m benchmarks.gpu_suite --set smoke --budget-s 180 --out "$W/results"
gate_passed=$("$PY" -c "import json; g = json.load(open('$W/suite/suite.json'))['gate']
print(int(bool(g) and all(r['status'] in ('pass', 'near-tie', 'skipped') for r in g)))" 2>/dev/null)
if [ "$gate_passed" != 1 ]; then
    echo "gate failed or did not run: nothing else run"; status=1
else
    run online 150 "$PY" -m benchmarks.online --milestone m11 --workload offline --max-requests 32 --rates 8,inf \
        --offline-reference --device cuda --no-progress --out-dir "$W/online"
    run kernel_bench 90 "$PY" -m benchmarks.kernel_bench --batch 1,16 --context 512 --out "$W/kernel_bench.json"
    run quant_bench 120 "$PY" -m benchmarks.quant_bench --quick --batches 1,16 --out "$W/quant_bench.json"
    run quant_step 120 "$PY" -m benchmarks.quant_step --model qwen3-0.6b-random --batches 1 --rounds 1 \
        --repeats 5 --out "$W/quant_step.json"
    run quant_accuracy 120 "$PY" -m benchmarks.quant_accuracy --num-prompts 2 --max-tokens 8 \
        --out "$W/quant_accuracy.json"
fi
cd "$OUT" && tar czf smoke.tgz smoke && rm -rf smoke && echo "-> $OUT/smoke.tgz"
exit $status
