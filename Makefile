# Two entry points: `make demo` and `make test`. Both create .venv if missing and install what is
# missing, torch's local CPU build first (so no CUDA wheels are pulled), then the package with extras.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ebpo-installed

.PHONY: demo test install lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev,trl,verl,embed]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ebpo train

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_advantages.py
	$(PY) benchmarks/bench_rewards.py
	$(PY) benchmarks/bench_eval.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
