#!/usr/bin/env bash
# The server's GPU call: m09 and m10 served one after the other, clients in a process of
# their own, on `offline` (Poisson rates up to a burst, beside the same engine's offline generate) and on the
# exact `nanovllm` (a burst of all 256). (The reliability run, 512 streams with 10% hanging up, was retired
# after commit 0c790fd: `git show 0c790fd:benchmarks/gpu_online.sh`.)
# The machine lacks fastapi, uvicorn and the tokenizer: install the carried wheels first (docs/benchmarks.md:
# pip install --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site). Results: $OUT/online/<gpu>/*.json.
#   OUT=/some/dir bash benchmarks/gpu_online.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/nanoserve-online}"
mkdir -p "$OUT/online"
common=(--milestone m09,m10 --device cuda --no-progress --out-dir "$OUT/online")
status=0
"$PY" -m benchmarks.online "${common[@]}" --workload offline --rates 4,8,16,32,64,inf --offline-reference || status=1
"$PY" -m benchmarks.online "${common[@]}" --workload nanovllm --rates inf --offline-reference || status=1
exit $status
