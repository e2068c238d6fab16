# Two entry points: `make demo` and `make test`.  Both create .venv with Python 3.11+ on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SDK    := .venv-sagemaker

.PHONY: demo test bench native clean browser containers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,native]'
	touch $(STAMP)

# The SageMaker Python SDK v3 in its own virtualenv, as a user's notebook has it (its pins are
# its own); uv (a test dependency) installs it in well under a minute.  For
# tests/integration/test_sagemaker_sdk.py.
$(SDK)/.installed: tests/sdk/requirements.txt $(STAMP)
	rm -rf $(SDK)
	$(BIN)/uv venv --quiet --python $(BIN)/python $(SDK)
	$(BIN)/uv pip install --quiet --python $(SDK)/bin/python -r tests/sdk/requirements.txt
	touch $@

# Compile the decision core with mypyc when its sources changed since the last build (a few
# seconds to check, ~30 s to build); without a C compiler it says so and the core runs
# interpreted.  `python -m quotasched.services.native status` tells which one runs.
native: $(STAMP)
	$(BIN)/python -m quotasched.services.native build

# `make demo EXECUTOR=agent`: the same story with real processes on fake GPUs (the GPU agent).
EXECUTOR ?= simulated
demo: native
	$(BIN)/quotasched demo --executor $(EXECUTOR)

# Test-only system tools, installed with apt where missing and apt can (root, Debian/Ubuntu);
# otherwise their tests skip with a loud reason.  A headless Chromium for the web view's and
# the report's browser tests (about 20 s); podman, runc and a static busybox (the test image's
# only file) for the GPU agent's container tests (about 20 s).
browser:
	@sh tests/tools/apt-ensure.sh chromium browser chromium

containers:
	@sh tests/tools/apt-ensure.sh podman container podman runc busybox-static

test: native $(SDK)/.installed browser containers
	$(BIN)/python -m pytest

bench: native
	$(BIN)/python benchmarks/replay_bench.py

# docs/web-view.png, the README's picture of the live web view, from `make demo`'s own story
# (runs `quotasched demo --serve`, screenshots the page with headless Chromium, stops it).
.PHONY: screenshot
screenshot: native browser
	$(BIN)/python -m quotasched.services.web.screenshot docs/web-view.png

clean:
	rm -rf $(VENV) $(SDK) .pytest_cache .hypothesis services/scheduler/core/_native
