#!/usr/bin/env bash
# m08's kernel on CUDA, before a suite call: the kernel tests compiled for the GPU (tests/test_m08_kernel.py runs
# them at full size when CUDA is there, the interpreter in CI), then the microbenchmark (benchmarks/kernel_bench.py).
#   OUT=/some/dir bash benchmarks/gpu_kernel_checks.sh      # -> $OUT/pytest_cuda.log, kernel_bench.{json,log}
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/nanoserve-kernel}"
mkdir -p "$OUT"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_m08_kernel.py > "$OUT/pytest_cuda.log" 2>&1
rc=$?
echo "pytest tests/test_m08_kernel.py on $("$PY" -c 'import torch; print(torch.cuda.get_device_name())'): exit $rc" \
    | tee -a "$OUT/pytest_cuda.log"
tail -n 3 "$OUT/pytest_cuda.log"
timeout 240 "$PY" -m benchmarks.kernel_bench --out "$OUT/kernel_bench.json" > "$OUT/kernel_bench.log" 2>&1
echo "kernel_bench: exit $?"
grep -E "^target" "$OUT/kernel_bench.log"
