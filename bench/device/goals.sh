#!/bin/bash
# Issue 32's goals on the device, one call, one table: a record campaign
# (the corpus's texts as one Parquet file, JSONL where the machine lacks
# pyarrow) through the worker path against SentenceTransformer.encode and
# against the model alone, at batch 16, 128 and the profile's chosen batch
# (bench/path_goals.py). Same preparation as run.sh:
#   run(command="bash bench/device/goals.sh", carry=[".gpu"], timeout_s=420)
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
  $PY -c "import torch, transformers, sentence_transformers as st, django
print(torch.__version__, transformers.__version__, st.__version__, django.__version__)"
  $PY -c "import pyarrow; print('pyarrow', pyarrow.__version__)" 2>/dev/null || echo "no pyarrow: JSONL records"
} 2>&1 | tee "$OUT/facts.txt"
since setup

# The profile's steps stop at MAX_BATCH (the H200 took 102 s to 4,096 at
# max_tokens 512; these are 256). GOALS_FLAGS: e.g. "--max-batch 32
# --budget-mb 2000" for a CPU rehearsal, or "--chosen 1024" to skip the profile.
# shellcheck disable=SC2086
DEBUG=0 timeout "${T1:-360}" $PY bench/path_goals.py --limit "$LIMIT" --corpus $CORPUS \
  --max-batch "${MAX_BATCH:-4096}" $GOALS_FLAGS 2>&1 | grep --line-buffered -v Loading | tee "$OUT/path_goals.log"
since path_goals

# Issue 34: the GPU utilisation a batch records (gpuworker/nvml.py), the mean of
# the driver's samples since a moment: near 100 over a busy stretch of matmuls,
# near 0 over an idle one.
timeout 90 $PY - <<'NVML' 2>&1 | tee "$OUT/nvml.txt"
import time

import torch

from gpuworker import nvml

x = torch.randn(8192, 8192, device="cuda")
busy_since = time.time()
for _ in range(300):
    x = torch.nn.functional.normalize(x @ x, dim=1)
torch.cuda.synchronize()
busy = nvml.utilization(since=busy_since)
idle_since = time.time()
time.sleep(3)
print(f"NVML utilisation: busy {busy} %, idle {nvml.utilization(since=idle_since)} %")
NVML
since nvml
