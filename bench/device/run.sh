#!/bin/bash
# The device run, prepared by bench/device/prepare.sh: setup, then the checks in
# order of value, each bounded so that a slow one leaves the others their time.
# Everything lands in $OUT (at most 8 files come back).
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
  $PY -c "import torch, transformers, sentence_transformers as st, django, celery
print(torch.__version__, transformers.__version__, st.__version__, django.__version__, celery.__version__)"
} 2>&1 | tee "$OUT/facts.txt"
since setup

timeout "${T1:-130}" $PY bench/gpu_check.py --limit "$LIMIT" --corpus $CORPUS --out "$OUT" 2>&1 |
  grep -v Loading | tee "$OUT/gpu_check.log"
since gpu_check

timeout "${T5:-90}" $PY bench/profile_device.py --limit "$LIMIT" --corpus $CORPUS --out "$OUT" 2>&1 |
  grep -v Loading | tee "$OUT/profile_device.log"
since "profile_device"

timeout "${T2:-100}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b16.log"
since "worker_path batch 16"

# pytest-env is not carried: its variables are set here.
VAR_DIR=var/test timeout "${T3:-90}" $PY -m pytest tests/gpuworker/test_batch_runner.py \
  tests/gpuworker/test_text_embedding.py tests/gpuworker/test_training.py -q -p no:cacheprovider \
  -o addopts="" 2>&1 | tail -40 >"$OUT/pytest_gpuworker.log"
tail -5 "$OUT/pytest_gpuworker.log"
since "pytest tests/gpuworker"


timeout "${T6:-60}" $PY bench/train_device.py --corpus $CORPUS --pairs 4000 --max-batch 512 \
  --precision bfloat16 2>&1 | grep -v "Loading\|Writing" | tee "$OUT/train_device.log"
since "train_device bfloat16"

timeout "${T4:-60}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS --batch-size 128 \
  --token-budget 32768 2>&1 | grep -v Loading | tee "$OUT/worker_path_b128.log"
since "worker_path batch 128"
