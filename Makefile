# Targets: dev (venv + deps), lint, test, docs. The tests need `make dev` first (scripts/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: dev lint test test-unit docs

dev:
	bash scripts/setup.sh

lint:
	$(VENV)/bin/ruff check ct200_tools tests benchmarks
	$(VENV)/bin/ruff format --check ct200_tools tests benchmarks
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

test-unit:
	$(PY) -m pytest tests/unit

docs:
	$(PY) -m ct200_tools.docs > docs/checks.md
