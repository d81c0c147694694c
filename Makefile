# Targets: dev (venv + deps), lint, test, docs. The tests need `make dev` first (scripts/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: dev lint lint-ansible test test-unit test-testbed docs

dev:
	bash scripts/setup.sh

lint:
	$(VENV)/bin/ruff check ct200_tools plugins tests benchmarks
	$(VENV)/bin/ruff format --check ct200_tools plugins tests benchmarks
	$(VENV)/bin/mypy

# Ansible: yamllint and ansible-lint (production profile, offline; .ansible-lint), and
# systemd-analyze verify on the repository's static unit files (failing on any stderr output;
# the units the roles render are verified on the testbed by tests/testbed).
ANSIBLE_PATHS := playbooks inventory benchmarks/ansible $(wildcard roles)
lint-ansible:
	$(VENV)/bin/yamllint -s $(ANSIBLE_PATHS) .yamllint .ansible-lint
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/ansible-lint $(ANSIBLE_PATHS)
	$(PY) -m ct200_tools.testbed verify-units

test: lint lint-ansible
	$(PY) -m pytest

# The local testbed and the Ansible tests on it (root; boots systemd-nspawn machines).
test-testbed:
	$(PY) -m pytest -m testbed tests/testbed

test-unit:
	$(PY) -m pytest tests/unit

docs:
	$(PY) -m ct200_tools.docs > docs/checks.md
