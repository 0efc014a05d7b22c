# Sourced by run.sh and short.sh on the device machine: our wheels into
# /tmp/site, the model's float32 weights back, the environment, the clock.
PY=${PY:-python3}
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LIMIT=${LIMIT:-3000}
CORPUS=.gpu/corpus_stdlib_docstrings_5000.jsonl.gz
t0=$(date +%s)
since() { echo "$1 at $(($(date +%s) - t0))s"; }

if [ -n "${REHEARSE:-}" ]; then
  # A CPU rehearsal of a script's steps in a venv that holds everything
  # (PY=/path/.venv/bin/python): no wheels, no weights to restore, the corpus
  # where prepare.sh takes it. A device run never sets it.
  CORPUS=${REHEARSE_CORPUS:-../shared/data/corpus_stdlib_docstrings_5000.jsonl.gz}
  return 0
fi
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/whl/*.whl || exit 3
$PY bench/device/restore_model.py || exit 4
export PYTHONPATH=/tmp/site:$PWD/.gpu/pkg
