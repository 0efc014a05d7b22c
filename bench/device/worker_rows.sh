#!/bin/bash
# Several worker processes feeding one GPU (WORKERS_PER_DEVICE): the CUDA test
# of the per-process memory share, then bench/worker_path.py's Celery rows
# (`celery worker -c N`, batch pipeline on and off) for N = 1, 2, 4 at batch 16
# and N = 1, 2 at batch 128, then the host work alone in 1, 2 and 4 processes,
# then planning's weighing of the texts (a call a text against the batch call
# on a thread per core: what the host's cores give it).
# Same preparation as run.sh:
#   run(command="bash bench/device/worker_rows.sh", carry=[".gpu"], timeout_s=580)
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
} 2>&1 | tee "$OUT/facts.txt"
since setup

VAR_DIR=var/test timeout "${T0:-60}" $PY -m pytest tests/gpuworker/test_device_share.py -q \
  -p no:cacheprovider -o addopts="" 2>&1 | tail -20 >"$OUT/pytest.log"
tail -3 "$OUT/pytest.log"
since pytest

DEBUG=0 timeout "${T1:-240}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS \
  --policies token_budget --processes "${PROCESSES:-1,2,4}" 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b16.log"
since "worker_path batch 16"

DEBUG=0 timeout "${T2:-150}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS \
  --batch-size 128 --token-budget 32768 --policies token_budget --processes 1,2 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b128.log"
since "worker_path batch 128"

for n in 1 2 4; do
  DEBUG=0 timeout "${T3:-30}" $PY bench/orchestration.py --limit "$LIMIT" --corpus $CORPUS \
    --processes $n 2>&1 | grep "token budget" | tee -a "$OUT/orchestration.log"
done
since orchestration

DEBUG=0 timeout "${T4:-20}" $PY bench/plan_costs.py --limit "$LIMIT" --corpus $CORPUS \
  --rounds 2 2>&1 | grep -v Loading | tee "$OUT/plan_costs.log"
since plan_costs
