# Two commands on a fresh machine (Debian, Python 3.11): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpuflow-installed

.PHONY: install demo test test-long faults lint typecheck docs clean-local airflow airflow-down test-deps bench bench-quick bench-serving controlplane

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV)

# The lock pins every transitive version. torch: the CPU wheel from the machine's find-links folder
# where pip's config names one (uv, seconds; pip took about a minute to unpack it), else pip with
# pip's own config (uv alone would take PyPI's CUDA build).
# Quiet (one line, then errors only): the lock's ~290 package lines would bury the demo's own output.
$(STAMP): $(BIN)/python requirements.lock pyproject.toml rehearsal/pyproject.toml
	@echo "make: installing requirements.lock, tpuflow and tpuflow-rehearsal into $(VENV) (the first time takes a few minutes)"
	@$(BIN)/python -m pip install -q --upgrade pip uv
	@$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode $(UV_FIND_LINKS) -r requirements.lock
	@$(if $(UV_FIND_LINKS),$(BIN)/uv pip install -q --python $(BIN)/python $(UV_FIND_LINKS) "torch==2.13.0",$(BIN)/python -m pip install -q "torch==2.13.0")
	@$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e . -e rehearsal
	@touch $(STAMP)

UV_FIND_LINKS := $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^.*find-links='\([^']*\)'.*/--find-links \1/p" | head -1)

install: $(STAMP)

demo: install
	$(BIN)/tpuflow demo

# CI runs this (.ci/run): the lint, the type check and the docs first (seconds, a minute or two), then the tests.
test: install test-deps controlplane lint typecheck docs
	$(BIN)/python -m pytest -q -m "not long" --durations=25 tests

# What `make test` leaves out for CI's size (tests marked `long`; docs/contributing/testing.md lists them).
test-long: install test-deps controlplane
	$(BIN)/python -m pytest -q -m long tests

lint: install
	$(BIN)/ruff check dags operators rehearsal plugins workloads tests bench examples docs
	$(BIN)/ruff format --check dags operators rehearsal plugins workloads tests bench examples docs

# The docs (docs/, Sphinx with MyST): warnings are errors and every cross-reference must resolve (nitpicky); then
# the local links of the README, the changelog and the docs (files and headings; external links are not followed).
docs: install
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	$(BIN)/python docs/_ext/local_links.py

# mypy, strict, on the tpuflow and tpuflow_rehearsal packages ([tool.mypy] in pyproject.toml); .pre-commit-config.yaml runs the same hooks.
typecheck: install
	$(BIN)/mypy

# The fault matrix in full (tests/faults: every stage x fault of the GKE pipeline on the stand-ins, and the
# table of what each run left behind); make test runs its CI slice.
faults: install controlplane
	$(BIN)/python -m pytest -q -rN tests/faults

# Every performance claim against its baseline, side by side (bench/README.md): writes
# bench/results/latest.json, latest.md and PNG charts. bench-quick is the CI-sized set.
bench: install
	$(BIN)/python -m bench

bench-quick: install
	$(BIN)/python -m bench --quick

# Every serve_* measure, the slice replicas (multi-host and single-host TPU) included (~13 min).
bench-serving: install
	$(BIN)/python -m bench --serving

# A real local Airflow (api-server, scheduler, dag-processor, triggerer; LocalExecutor; 127.0.0.1):
# prints the UI URL and the admin login. `make airflow-down` stops exactly what it started.
airflow: install
	$(BIN)/tpuflow airflow up

airflow-down:
	$(BIN)/tpuflow airflow down

# Headless Chromium for the UI tests (tests/airflow_services): Debian's package, driven through
# Playwright's Python API (pinned in requirements.lock) at its own path: no browser download, and
# `playwright install` is never needed.
test-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "make test-deps: install Chromium first: sudo apt-get install -y chromium" >&2; exit 1; fi; }

# The real control plane of the GKE rehearsal (issue 46): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and the KubeRay operator, built from the Go modules pinned in controlplane/ into .controlplane/
# (cached in ~/.cache/tpuflow/controlplane by the inputs' hash: a cold build is ~15 CPU-minutes, a cached one seconds).
controlplane:
	bash controlplane/build.sh
