# `make run`: set up .venv (CPU TensorFlow, no CUDA wheels) and run the ResNet-50 smoke benchmark.
# `make test`: set up .venv and run the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --disable-pip-version-check -e ".[cpu,test]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/mlperf-harness run configs/resnet/smoke.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) logs/*/ .pytest_cache
