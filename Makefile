# kallot developer entry points. Two commands set up everything on a fresh machine:
#   make demo   -> venv + `kallot sim openb` on the bundled default trace (table + HTML report)
#   make test   -> venv + control plane (built once, cached outside the repo) + lint + the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv demo test lint typecheck unit controlplane conformance bench clean

$(BIN)/kallot: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/kallot

demo: venv
	$(BIN)/kallot sim openb

controlplane:
	bash tools/testenv/build.sh

lint: venv
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/lint-imports
	$(BIN)/mypy

test: venv controlplane lint
	$(BIN)/pytest -q -p no:cacheprovider

unit: venv
	$(BIN)/pytest -q -m "not controlplane"

# The release run of the differential suite against the real kube-scheduler (BENCHMARKS.md,
# "Conformance"); `make test` runs 40 clusters.
CONFORMANCE_EXAMPLES ?= 2000
conformance: venv controlplane
	KALLOT_CONFORMANCE_EXAMPLES=$(CONFORMANCE_EXAMPLES) $(BIN)/pytest -q -s -p no:cacheprovider tests/kube/test_conformance.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
