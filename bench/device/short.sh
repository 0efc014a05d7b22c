#!/bin/bash
# A second, shorter device call (about 4 minutes) for what a first run showed:
# the CUDA-only tests, precisions each after its own warm-up pass, the
# worker path at batch 16 in-process, and the idle time between forward passes
# with and without the next batch's images prefetched. Same preparation as run.sh:
#   run(command="bash bench/device/short.sh", carry=[".gpu"], timeout_s=300)
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/facts.txt"
since setup

VAR_DIR=var/test timeout "${T1:-60}" $PY -m pytest tests/gpuworker/test_batch_runner.py \
  tests/gpuworker/test_training.py tests/campaigns/test_outputs.py -q -p no:cacheprovider \
  -o addopts="" 2>&1 | tail -40 >"$OUT/pytest.log"
tail -5 "$OUT/pytest.log"
since pytest

timeout "${T2:-100}" $PY bench/gpu_check.py --limit "$LIMIT" --corpus $CORPUS --out "$OUT" \
  $GPU_CHECK_FLAGS 2>&1 | grep -v "Loading\|gpuworker.runner\|campaigns.runs.recording" | tee "$OUT/gpu_check.log"
since gpu_check

timeout "${T3:-90}" $PY bench/worker_path.py --limit "$LIMIT" --corpus $CORPUS --skip-celery 2>&1 |
  grep -v Loading | tee "$OUT/worker_path_b16.log"
since "worker_path batch 16"

DEBUG=0 timeout "${T4:-30}" $PY bench/input_prefetch.py --images 256 --repeat 1 2>&1 |
  grep "^[|#]" | tee "$OUT/input_prefetch.log"
since input_prefetch
