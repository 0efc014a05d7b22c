#!/bin/bash
# The whole worker path on the device machine: bench/worker_path.py with its
# Celery rows (a real worker process, batch pipeline on and off) at batch 16,
# then batch 128 with and without the pipeline, then the host work alone.
# Same preparation as run.sh:
#   run(command="bash bench/device/worker_rows.sh", carry=[".gpu"], timeout_s=330)
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
} 2>&1 | tee "$OUT/facts.txt"
since setup

DEBUG=0 timeout "${T1:-150}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b16.log"
since "worker_path batch 16"

DEBUG=0 timeout "${T2:-100}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS \
  --batch-size 128 --token-budget 32768 --policies token_budget --pipeline 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b128.log"
since "worker_path batch 128"

DEBUG=0 timeout "${T3:-40}" $PY bench/orchestration.py --limit "$LIMIT" --corpus $CORPUS 2>&1 |
  grep "token budget" | tee "$OUT/orchestration.log"
since orchestration
