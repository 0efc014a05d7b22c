# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
MANAGE := $(BIN)/python manage.py
HOST ?= 127.0.0.1
PORT ?= 8000

# Models load from installed packages or local folders only, never from a hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test lint mypy-baseline worker clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the local CPU wheel. An open range would pull a
	# multi-GB CUDA build. pyproject.toml declares torch>=2.4, which this meets.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

run: install
	$(MANAGE) migrate --verbosity 0
	$(MANAGE) demo
	@echo ""
	@echo "  Dashboard: http://$(HOST):$(PORT)/   (log in as demo / demo-briefgpu)"
	@echo "  Rent GPUs: http://$(HOST):$(PORT)/order/   (staff: staff / staff-briefgpu)"
	@echo "  Stop with Ctrl-C (stops the web server and the worker)."
	@echo ""
	@trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT INT TERM; \
	$(BIN)/celery -A portal worker -Q gpu,portal -c 1 --beat --without-gossip --without-mingle \
		--without-heartbeat --loglevel INFO & worker=$$!; \
	$(MANAGE) runserver $(HOST):$(PORT)

# One worker with the embedded beat (a process of its own that runs the lease
# sweeps itself, portal/beat.py), on both queues (`gpu` batches, `portal` order
# sweeps and planning); on several nodes run `celery -A portal beat` once instead
# (docs/architecture.md) and a `-Q portal` worker (docs/deployment.md).
worker: install
	$(BIN)/celery -A portal worker -Q gpu,portal -c 1 --beat --without-gossip --without-mingle \
		--without-heartbeat --loglevel INFO

# The layers (import-linter) and the types (mypy, held to .ci/mypy-baseline.txt)
# before the tests: pyproject.toml's tool.importlinter and tool.mypy say what they check.
test: install
	$(MANAGE) makemigrations --check --dry-run
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	BIN=$(BIN) .ci/mypy
	$(BIN)/pytest

# Rewrites .ci/mypy-baseline.txt from today's mypy errors: after modules move or
# errors are fixed. Review its diff: it should only lose lines or rename paths.
mypy-baseline: install
	BIN=$(BIN) .ci/mypy sync

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf var
