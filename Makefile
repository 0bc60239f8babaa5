# The README's commands. Each installs what it needs on a fresh Debian/Ubuntu machine.
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.installed-$(shell cat pyproject.toml exporter/pyproject.toml constraints/*.txt | sha1sum | cut -c1-12)
# what `make install` installs (and `make constraints` pins)
PACKAGES := -e '.[dev]' -e './exporter[dev,k8s]'
# the versions `make test` passed with, for the venv's Python (constraints/py3.11.txt): see its header
CONSTRAINTS = constraints/py$$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])').txt
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export DAGSTER_HOME ?= $(CURDIR)/.foxhunt/dagster_home
# Python caches the compiled tests and package (__pycache__/, ignored by git): collecting the suite takes
# half the time it takes with the cache off
unexport PYTHONDONTWRITEBYTECODE

# make test's pytest-xdist workers: most of the suite waits on servers (Prometheus, MLflow, Dagster runs), not
# on the CPU, so more workers than cores pays: on 2 cores, pytest took 7:43 on 2 workers, 7:03 on 3 and 5:36
# on 4 (one worker: 15 to 25 minutes)
WORKERS ?= 4
# dg runs the project's venv (.venv); VIRTUAL_ENV says it is the active one
DG := VIRTUAL_ENV=$(CURDIR)/.venv .venv/bin/dg
# (without mkdocs-material's banner about its successor)
MKDOCS := NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs

.PHONY: demo test check docs ui bench lint install constraints prometheus chromium alertmanager pushgateway postgresql sandbox-down

install: $(STAMP) prometheus chromium alertmanager pushgateway postgresql

$(STAMP):
	@command -v python3 >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y python3 python3-venv; }
	@[ -x .venv/bin/pip ] || python3 -m venv .venv || { $(SUDO) apt-get update && $(SUDO) apt-get install -y python3-venv && python3 -m venv .venv; }
	.venv/bin/pip install -q --upgrade pip
	@c=$(CONSTRAINTS); if [ -f $$c ]; then echo "installing the tested versions ($$c)"; pin="-c $$c"; \
	else echo "no $$c: installing the newest versions pyproject.toml allows"; pin=; fi; \
	.venv/bin/pip install -q $$pin $(PACKAGES)
	rm -f .venv/.installed-* && touch $@

# constraints/py3.11.txt anew: a throwaway venv on the image's Python resolved from pyproject.toml alone,
# with what `make install` installs
constraints:
	@command -v python3.11 >/dev/null || { echo "make constraints needs python3.11 (the image's Python)"; exit 1; }
	rm -rf .venv-constraints && python3.11 -m venv .venv-constraints
	.venv-constraints/bin/pip install -q --upgrade pip
	.venv-constraints/bin/pip install -q $(PACKAGES)
	{ sed -n '/^#/p' constraints/py3.11.txt; .venv-constraints/bin/pip freeze --exclude-editable; } \
	  > constraints/py3.11.txt.new && mv constraints/py3.11.txt.new constraints/py3.11.txt
	rm -rf .venv-constraints

prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  echo "installing Prometheus (Debian package)"; \
	  $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y prometheus; \
	fi

# Headless Chromium renders the weekly report's HTML in the tests (foxhunt_obs_tests/lib/report).
chromium:
	@if ! command -v chromium >/dev/null; then \
	  echo "installing Chromium (Debian package)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi

# Alertmanager receives the alert sensors' notifications in the tests (foxhunt_obs_tests/lib/delivery, sandbox).
# --no-install-recommends: the binary only, no system service is enabled by the tests.
alertmanager:
	@if ! [ -x /usr/bin/prometheus-alertmanager ]; then \
	  echo "installing Alertmanager (Debian package)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null; \
	fi

# The Pushgateway receives the batch side's spend figures in the tests (foxhunt_obs_tests/lib/delivery).
# --no-install-recommends: the binary only; the tests run it with persistence off, no service is enabled.
pushgateway:
	@if ! [ -x /usr/bin/prometheus-pushgateway ]; then \
	  echo "installing Pushgateway (Debian package)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus-pushgateway >/dev/null; \
	fi

# PostgreSQL holds the Dagster instance in the Postgres end-to-end test (foxhunt_obs_tests/e2e/test_dagster_postgres.py,
# foxhunt_obs/sandbox/servers/postgres.py). --no-install-recommends: the server binaries only; the test runs its own
# postgres on a temp data dir and a free port, no cluster service is used.
postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
	  echo "installing PostgreSQL (Debian package)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	fi

demo: install
	$(PY) -m foxhunt_obs.cli demo

# Everything: every test on $(WORKERS) workers (the slowest listed), the definitions loaded as `dg` loads
# them, the docs site built with every link checked (into site/, ignored by git). pytest exits 5 when it
# collects no test: a failure. A worker takes a whole file at a time (a file's servers start once), in the
# order conftest.py gives (the longest files first).
test: install
	$(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25
	@mkdir -p $(DAGSTER_HOME) && $(DG) check defs
	$(MKDOCS) build --strict --quiet

# The quick tier, before a commit (under 90 s): lint, the definitions load, and the tests that start no
# server or process (the root conftest.py says which those are). Needs the venv only, no server installed.
check: $(STAMP)
	@t0=$$(date +%s); \
	.venv/bin/ruff check . && \
	mkdir -p $(DAGSTER_HOME) && $(DG) check defs && \
	$(PY) -m pytest -m "not servers" -n 2 -q; \
	rc=$$?; echo "make check: $$(( $$(date +%s) - t0 )) s"; exit $$rc

# The docs site: the reference pages regenerated from the code's registries, then built with every link
# checked (into site/; `.venv/bin/mkdocs serve` shows it on http://127.0.0.1:8000)
docs: $(STAMP)
	$(PY) tools/reference_pages.py
	$(MKDOCS) build --strict

ui: install
	$(PY) -m foxhunt_obs.cli sandbox up
	mkdir -p $(DAGSTER_HOME) && touch $(DAGSTER_HOME)/dagster.yaml
	eval "$$($(PY) -m foxhunt_obs.cli sandbox env)" && \
	  trap '$(PY) -m foxhunt_obs.cli sandbox down' EXIT && \
	  .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

sandbox-down:
	$(PY) -m foxhunt_obs.cli sandbox down

bench: install
	$(PY) bench/prometheus_ingest.py
	$(PY) bench/prometheus_processes.py
	$(PY) bench/exporter.py
	$(PY) bench/mlflow_ingest.py
	$(PY) bench/report.py
	$(PY) bench/sensors.py
	$(PY) bench/lake_s3.py
	$(PY) bench/summary.py

lint: install
	.venv/bin/ruff check .
