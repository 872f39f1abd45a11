# Two commands do everything on a fresh machine:
#   make bench   set up .venv, then train on every local GPU through torchrun (a CPU smoke run without a GPU)
#   make test    set up .venv, then run the CPU test suite (what CI runs)
# CONSTRAINTS=constraints.txt make bench installs the exact versions behind the committed results.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bench test venv
venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@echo "== creating $(VENV) and installing torch, torchvision, lightning, fairscale, pytest (several GB, minutes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[dev]' \
		| grep --line-buffered -E '^(Collecting|Downloading|Installing|Successfully)' || true
	$(BIN)/python -c "import torch, torchvision, lightning, fairscale"
	@echo "== $(VENV) is ready"
	touch $@

bench: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" ./tools/main_job.sh

# the suite on two workers, each test file on one of them (its module fixtures once)
test: venv
	$(BIN)/python -m pytest -q -n 2 --dist loadfile
