#!/usr/bin/env bash
# m13 on CUDA, in parts (each under its own timeout; name the parts to run, default: tests bench):
#   gate      the float32 correctness gate of m13 (unquantized) on qwen3-0.6b-random                        ~1 min
#   tests     tests/test_m13_quantization.py compiled for the GPU (Qwen3-8B's layer shapes, every candidate)  ~4-5 min
#   bench     python -m benchmarks.quant_bench: every candidate at Qwen3-8B's shapes, batch 1-2048         < 3 min
#             (BENCH_ARGS adds flags, e.g. "--batches 1,2,4,8,16,32 --budget-s 220"; it is split at spaces, so
#             --candidates, whose names hold spaces, is for quant_bench run by hand after sourcing gpu_env.sh)
#   probe     python -m benchmarks.step_probe on m13's nanovllm steady state, bf16 and then FP8 K/V            ~2 min
#   step      python -m benchmarks.quant_step --gate: the batch-1/4/16 decode step on qwen3-8b-random       ~5 min
#             (STEP_ARGS replaces --gate, e.g. "--batches 1,4 --rounds 3" after the gate part)
#   accuracy  python -m benchmarks.quant_accuracy on qwen3-0.6b-random and qwen3-8b-random             ~6-8 min
#   OUT=/some/dir NANOSERVE_GIT_COMMIT=<sha> bash benchmarks/gpu_quant_checks.sh tests bench   # -> $OUT/quant.tgz
# (estimates, not measured: one command may run 10 minutes, so `step` and `accuracy` go in separate calls)
# Everything ends in one tarball: the device returns at most 8 files.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
OUT="${OUT:-/tmp/nanoserve-quant}"
WORK="$OUT/quant"
mkdir -p "$WORK"
# The machine's copy of .git may be a stale HEAD: the commit every JSON records comes from the caller (env.py).
[ -n "${NANOSERVE_GIT_COMMIT:-}" ] || echo "warning: NANOSERVE_GIT_COMMIT is not set: the JSON records this copy's .git HEAD" >&2
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests bench)
for part in "${parts[@]}"; do
    case "$part" in
        gate)
            timeout 200 "$PY" -c "import json, sys; from benchmarks.gate import CorrectnessGate, GateItem
gate = CorrectnessGate('qwen3-0.6b-random', 'cuda'); record = gate.check(GateItem('m13', 'nanovllm')); gate.close()
json.dump(record, open('$WORK/gate_m13.json', 'w'), default=str); sys.exit(record['status'] not in ('pass', 'near-tie'))" \
                > "$WORK/gate.log" 2>&1 || { echo "gate failed: nothing measured"; tail -n 5 "$WORK/gate.log"; break; }
            echo "gate: pass" ;;
        tests)
            timeout 480 "$PY" -m pytest -q -p no:cacheprovider tests/test_m13_quantization.py \
                > "$WORK/pytest_m13_cuda.log" 2>&1
            echo "pytest tests/test_m13_quantization.py: exit $?"; tail -n 3 "$WORK/pytest_m13_cuda.log" ;;
        bench)
            # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
            timeout 280 "$PY" -m benchmarks.quant_bench ${BENCH_ARGS:-} --out "$WORK/quant_bench.json" \
                > "$WORK/quant_bench.log" 2>&1
            echo "quant_bench: exit $?"; grep -E "^batch-1 sum|^->" "$WORK/quant_bench.log" ;;
        step)
            # shellcheck disable=SC2086  # STEP_ARGS is a list of flags
            timeout 480 "$PY" -m benchmarks.quant_step ${STEP_ARGS:---gate} --out "$WORK/m13_step_times.json" \
                > "$WORK/quant_step.log" 2>&1
            echo "quant_step: exit $?"; grep -E "vs bf16 at batch|^target|gate failed" "$WORK/quant_step.log" ;;
        accuracy)
            timeout 200 "$PY" -m benchmarks.quant_accuracy --out "$WORK/m13_accuracy.json" \
                > "$WORK/quant_accuracy.log" 2>&1
            echo "quant_accuracy (qwen3-0.6b-random): exit $?"
            timeout 420 "$PY" -m benchmarks.quant_accuracy --model qwen3-8b-random \
                --out "$WORK/m13_accuracy+qwen3-8b-random.json" > "$WORK/quant_accuracy_8b.log" 2>&1
            echo "quant_accuracy (qwen3-8b-random): exit $?"
            grep -hE "rel. RMS" "$WORK/quant_accuracy.log" "$WORK/quant_accuracy_8b.log" ;;
        probe)
            for kv in auto fp8; do
                timeout 200 "$PY" -m benchmarks.step_probe --milestone m13 --set "kv_cache_dtype=\"$kv\"" \
                    --out-dir "$WORK/probe-$kv" > "$WORK/step_probe_m13_$kv.log" 2>&1
                echo "step_probe m13 kv_cache_dtype=$kv: exit $?"; head -n 14 "$WORK/step_probe_m13_$kv.log"
            done ;;
        *) echo "unknown part '$part': use gate, tests, bench, step, accuracy or probe" >&2; exit 2 ;;
    esac
done
cd "$OUT" && tar czf quant.tgz quant && rm -rf quant && echo "-> $OUT/quant.tgz"
