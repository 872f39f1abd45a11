# Two commands do everything on a fresh machine:
#   make bench   set up .venv, then train on every local GPU through torchrun (a CPU smoke run without a GPU)
#   make test    set up .venv, then run the CPU test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bench test venv
venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

bench: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" ./tools/main_job.sh

test: venv
	$(BIN)/python -m pytest -q
