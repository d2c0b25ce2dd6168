# The two commands a new user needs (README): `make demo` and `make test`.
# Both run the set-up first; it is idempotent and quick when nothing is missing.
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-unit test-privileged lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/pyfelix lab demo

# The conformance suite runs first, in a pytest process of its own (the longest lab run, on
# the smallest heap). Its transient denials after the rest of the suite came from the test
# process, not the dataplane: probes and echo servers are threads of pytest, and a full
# garbage collection of the heap the suite had built (~500 MB) stopped them long enough for
# half-second probes to time out. tests/conftest.py now collects and freezes the heap before
# every test and prints the session's longest collector pauses.
test: setup lint
	$(PY) -m pytest -q tests/privileged/conformance
	$(PY) -m pytest -q tests --ignore=tests/privileged/conformance

test-unit: setup
	$(PY) -m pytest -q -m "not privileged" tests

test-privileged: setup
	$(PY) -m pytest -q -m privileged tests

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: setup
	mkdir -p bench
	$(VENV)/bin/pyfelix bench -o json > bench/results.json
	$(PY) -m pyfelix.bench.report bench/results.json --plots bench --baseline bench/baseline_linear_walk.json > bench/results.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
