# `make run`: set up .venv (CPU TensorFlow, no CUDA wheels) and run the ResNet-50 smoke benchmark.
# `make test`: set up .venv, lint (ruff, pyproject.toml's [tool.ruff]) and run the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test quick setup clean

# pip byte-compiles what it installs (no --no-compile): where PYTHONDONTWRITEBYTECODE is set, as on these
# machines, every process would otherwise compile TensorFlow's and Keras's Python anew (import tensorflow
# measured 16.6 s without the .pyc files, 6.6 s with them; the test suite starts ~100 processes).
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[cpu,test]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/mlperf-harness run configs/resnet/smoke.yaml

# In parallel, one pytest-xdist worker per core (at most 4; tests/conftest.py), each test file in one worker
# (module fixtures stay shared). `pytest tests/test_x.py -k ...` alone runs serially, as before.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n auto --dist loadfile tests

# The quick tier (docs/testing.md): the files marked `quick`, on the same workers as `make test`.
quick: $(STAMP)
	$(BIN)/python -m pytest -q -m quick -n auto --dist loadfile tests

clean:
	rm -rf $(VENV) logs/*/ .pytest_cache
