# The two commands the README promises on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
NPM    := npm --no-audit --no-fund --loglevel=error

DEV_STAMP     := $(VENV)/.dev-installed
RUN_STAMP     := $(VENV)/.installed
TEST_SERVERS  := tests/npm/node_modules/.installed
INSPECTOR     := tests/npm-inspector/node_modules/.installed
CONFORMANCE   := tests/npm-conformance/node_modules/.installed
HOSTS         := tests/npm-hosts/node_modules/.installed
DEMO_SERVER   := examples/filesystem/node_modules/.installed

.PHONY: test demo bench lint typecheck pytest clean system-test

# Debian packages the tests drive for real, installed only where missing:
# bubblewrap (the sandbox), Chromium and its driver (the inbox in a browser),
# PostgreSQL (the store's second backend; Debian keeps initdb off PATH).
TEST_PACKAGES := bwrap=bubblewrap chromium=chromium chromedriver=chromium-driver \
	'initdb|/usr/lib/postgresql/*/bin/initdb=postgresql'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@ $(RUN_STAMP)

# Pinned by exact version and integrity hash; no package's install scripts run.
$(TEST_SERVERS): tests/npm/package-lock.json
	cd tests/npm && $(NPM) ci --ignore-scripts
	touch $@

$(INSPECTOR): tests/npm-inspector/package-lock.json
	cd tests/npm-inspector && $(NPM) install --ignore-scripts
	touch $@

# The official MCP conformance suite (tests/proxy/test_proxy_conformance.py).
$(CONFORMANCE): tests/npm-conformance/package-lock.json
	cd tests/npm-conformance && $(NPM) ci --ignore-scripts
	touch $@

# Real hosts the tests drive headless (tests/proxy/test_proxy_real_hosts.py). Without its
# install script Claude Code's bin/claude.exe stays a stub; the tests run the native binary
# from the platform package npm installed beside it.
$(HOSTS): tests/npm-hosts/package-lock.json
	cd tests/npm-hosts && $(NPM) ci --ignore-scripts
	touch $@

$(DEMO_SERVER): examples/filesystem/package-lock.json
	cd examples/filesystem && $(NPM) ci --ignore-scripts
	touch $@

LINT_PATHS := src tests $(wildcard benchmarks)

lint: $(DEV_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

system-test:
	tools/debian-packages $(TEST_PACKAGES)

pytest: system-test $(DEV_STAMP) $(TEST_SERVERS) $(INSPECTOR) $(CONFORMANCE) $(HOSTS) $(DEMO_SERVER)
	# Two workers (most tests wait on a subprocess); a file stays on one worker,
	# so its module-scoped servers start once.
	$(BIN)/pytest -q -n 2 --dist loadfile

test: lint typecheck pytest

# The demo's filesystem server runs inside bubblewrap.
demo: $(RUN_STAMP) $(DEMO_SERVER)
	tools/debian-packages bwrap=bubblewrap
	$(BIN)/agentrt demo

bench: $(DEV_STAMP) $(TEST_SERVERS)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) tests/npm/node_modules tests/npm-inspector/node_modules tests/npm-conformance/node_modules tests/npm-hosts/node_modules examples/filesystem/node_modules
