# Two entry points: `make demo` and `make test`. Each creates the virtual environment(s) it needs if missing
# and installs what is missing: torch first, then the package with extras (which keep the torch installed).
# Which torch build: `pip install torch==2.13.0` from the default index, which on Linux is the CUDA build
# (several GB); on a CPU-only Linux machine pass PyTorch's CPU index, e.g.
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (pip's own configuration applies either way: a machine whose pip has a local wheel folder uses it).
# Two environments, because verl 0.9's workers cannot run beside TRL 1.x (verl's FSDP engine
# imports a TRL class that TRL 1.x removed; docs/integrations.md):
#   .venv       core + TRL + embeddings + reasoning-gym + trackers  (`ebpo[dev,trl,embed,gym,wandb,mlflow]`): the demo,
#               the whole suite
#   .venv-verl  core + verl + reasoning-gym              (`ebpo[dev,verl,gym]`): the verl adapter's tests, incl. the
#               CPU end-to-end run
# `make test` builds both and runs the suite in .venv, then the verl tests in .venv-verl (CI runs `make test`).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ebpo-installed
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.ebpo-installed
VERL_TESTS := tests/integrations/verl
# torch 2.13.0, not the newest (2.15.0): README's demo table, docs/results and the shipped base model's
# bit-for-bit check were made on 2.13.0+cpu, and CI installs it from a local CPU wheel (2.15.0 is a multi-GB
# CUDA download in every CI run). The newest, tested (docs/integrations.md, "Tested releases"), in environments
# of its own (an existing one keeps the torch it has): make demo TORCH_VERSION=2.15.0 VENV=.venv-torch2.15
TORCH_VERSION ?= 2.13.0
TEST_WORKERS ?= 2
TORCH_INDEX ?=
export TORCH_INDEX TORCH_VERSION  # the wheel test (tests/test_package.py) installs the same torch
TORCH_INSTALL = install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: demo test test-main test-verl install verl-env lint bench gpu-wheels gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) $(TORCH_INSTALL)
	$(PIP) install -q -e ".[dev,trl,embed,gym,wandb,mlflow]"
	touch $(STAMP)

$(VERL_STAMP): pyproject.toml
	test -x $(VERL_PY) || python3 -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install -q --upgrade pip
	$(VERL_PY) -m pip $(TORCH_INSTALL)
	$(VERL_PY) -m pip install -q -e ".[dev,verl,gym]"
	touch $(VERL_STAMP)

install: $(STAMP) $(VERL_STAMP)

verl-env: $(VERL_STAMP)

demo: $(STAMP)
	$(VENV)/bin/ebpo train

test: test-main test-verl

# The .venv suite runs in TEST_WORKERS processes (pytest-xdist), each test file in one of them, the files with a
# slow test first (tests/conftest.py); the verl suite runs in one, since its end-to-end runs already keep every
# core busy (tests/integrations/verl/conftest.py).
test-main: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

test-verl: $(VERL_STAMP)
	$(VERL_PY) -m pytest -q --durations=15 $(VERL_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	$(VENV)/bin/ruff format --check src tests benchmarks examples tools
	$(VENV)/bin/mypy src

bench: $(STAMP) $(VERL_STAMP)
	$(VERL_PY) benchmarks/bench_advantages.py  # compares against verl's own GRPO functions
	$(PY) benchmarks/bench_rewards.py
	$(PY) benchmarks/bench_eval.py

# The GPU check (benchmarks/gpu_check.py; docs/benchmarks.md, "GPU check"). Here, with a network: the wheels
# a GPU machine with torch, transformers and accelerate lacks, for its Python (GPU_PYTHON), into .whl/.
# There, with no network (the device tool: carry .whl): install them aside and run the check on CUDA.
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= .whl
GPU_SITE ?= /tmp/ebpo-gpu-site

gpu-wheels:
	mkdir -p $(GPU_WHEELS)
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(GPU_WHEELS) -r benchmarks/gpu_wheels.txt
	python$(GPU_PYTHON) -m pip wheel -q --no-deps --no-binary=:all: -w $(GPU_WHEELS) -r benchmarks/gpu_sdists.txt
	du -sh $(GPU_WHEELS)

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) \
		$(GPU_WHEELS)/*.whl
	PYTHONPATH=src:$(GPU_SITE) PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out docs/results/gpu.md

clean:
	rm -rf $(VENV) $(VERL_VENV) build dist *.egg-info src/*.egg-info
