# Two entry points: `make demo` and `make test`.  Both create .venv with Python 3.11+ on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench native clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,native]'
	touch $(STAMP)

# Compile the decision core with mypyc when its sources changed since the last build (a few
# seconds to check, ~30 s to build); without a C compiler it says so and the core runs
# interpreted.  `python -m quotasched.services.native status` tells which one runs.
native: $(STAMP)
	$(BIN)/python -m quotasched.services.native build

demo: native
	$(BIN)/quotasched demo

test: native
	$(BIN)/python -m pytest

bench: native
	$(BIN)/python benchmarks/replay_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis services/scheduler/core/_native
