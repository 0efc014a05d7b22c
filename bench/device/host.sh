#!/bin/bash
# The worker's host work on the device machine, this code beside an earlier
# commit's (prepared with BEFORE=<commit> bash bench/device/prepare.sh), then
# the batch-size profiler alone with a longer bound:
#   run(command="bash bench/device/host.sh", carry=[".gpu"], timeout_s=540)
# shellcheck source=bench/device/setup.sh
. "$(dirname "$0")/setup.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nproc
  $PY -c "import torch, transformers, sentence_transformers as st, django
print(torch.__version__, transformers.__version__, st.__version__, django.__version__)"
} 2>&1 | tee "$OUT/facts.txt"
since setup
here=$PWD
before=$here/.gpu/before
corpus=$here/$CORPUS

VAR_DIR=var/test timeout "${T1:-60}" $PY -m pytest tests/gpuworker/test_batch_runner.py \
  tests/campaigns/test_outputs.py -q -p no:cacheprovider -o addopts="" 2>&1 |
  tail -30 >"$OUT/pytest.log"
tail -3 "$OUT/pytest.log"
since pytest

# The model replaced by an instant stand-in: host work alone, ms a unit;
# before, after, before, after, so a drift of the machine shows.
for round in 1 2; do
  for side in before after; do
    dir=$here
    [ $side = before ] && dir=$before
    [ -d "$dir" ] || continue
    (cd "$dir" && DEBUG=0 timeout "${T2:-40}" $PY bench/orchestration.py --limit "$LIMIT" \
      --corpus "$corpus" 2>&1 | grep "token budget" | sed "s/^/$side: /") | tee -a "$OUT/orchestration.log"
  done
done
since orchestration

# End to end at batch 16 against sentence-transformers, token budget, with
# and (after only) without the batch pipeline.
if [ -d "$before" ]; then
  (cd "$before" && DEBUG=0 timeout "${T3:-70}" $PY bench/worker_path.py --limit "$LIMIT" \
    --corpus "$corpus" --skip-celery 2>&1 | grep -v Loading) | tee "$OUT/worker_path_before.log"
  since "worker_path before"
fi
DEBUG=0 timeout "${T4:-70}" $PY bench/worker_path.py --limit "$LIMIT" --corpus "$corpus" \
  --skip-celery --policies length_grouped,token_budget --pipeline 2>&1 | grep -v Loading | tee "$OUT/worker_path_after.log"
since "worker_path after"

timeout "${T5:-200}" $PY bench/profile_device.py --limit "$LIMIT" --corpus "$corpus" --out "$OUT" 2>&1 |
  grep -v Loading | tee "$OUT/profile_device.log"
since profile_device
