#!/usr/bin/env bash
# The test suite on a GPU machine (the H200), where the CUDA-only tests run and CI's CPU cannot see them.
# The machine has torch, triton, transformers and pytest-xdist but not the server's packages: the wheels carried in
# .whl/ are installed first (AGENTS.md, "A GPU call"). Tests that need a notebook kernel skip there with a reason.
#   OUT=/some/dir bash benchmarks/gpu_pytest.sh                       # the whole suite, a worker per core
#   OUT=/some/dir bash benchmarks/gpu_pytest.sh tests/test_m12_*.py   # the files a change touched
# Writes $OUT/pytest_cuda.log (the summary line, failures, the 30 slowest tests); exits with pytest's status.
# PYTEST_TIMEOUT_S=N interrupts pytest after N seconds as Ctrl-C would: it still writes what ran and the slowest.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # the repository as the working directory, $PY, the wheels
OUT="${OUT:-/tmp/nanoserve-pytest}"
mkdir -p "$OUT"
# A thread per worker: with a worker per core, torch's own threads (one per core each) only contend; the tests'
# models are tiny. On the H200's 16 cores without this, tests ran 2-5x slower than on a 2-core laptop.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS=1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
workers=()  # work stealing: a worker that ends early takes tests queued for a busy one; `nproc --all`: plain
# nproc honours OMP_NUM_THREADS (1, above) and would start a single worker
"$PY" -c "import xdist" 2>/dev/null && workers=(-n "${PYTEST_WORKERS:-$(nproc --all)}" --dist worksteal)
timeout -s INT "${PYTEST_TIMEOUT_S:-0}" "$PY" -m pytest -q -rfs -p no:cacheprovider --durations=30 "${workers[@]}" \
    "${@:-tests}" 2>&1 | tee "$OUT/pytest_cuda.log"
exit "${PIPESTATUS[0]}"
