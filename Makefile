# Targets: dev (venv + deps), lint, test, test-fast, docs, wheelhouse. The tests need `make dev`
# first (scripts/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: dev lint lint-ansible test test-fast test-unit test-llama test-testbed docs wheelhouse

dev:
	bash scripts/setup.sh

# Python: ruff over the whole repository (pyproject's config), mypy strict on ct200_tools and
# the dev-only testbed.
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Ansible: yamllint and ansible-lint (production profile, offline; .ansible-lint) over the whole
# repository, as a user runs them from its root, and systemd-analyze verify (failing on any stderr
# output) on the repository's static unit files and on the unit of every server of the example
# site, rendered from templates/ (tests/unit/test_server_units.py verifies more variants; the
# units the roles install are verified on the testbed by tests/testbed).
lint-ansible:
	$(VENV)/bin/yamllint -s .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/ansible-lint
	$(PY) -m testbed verify-units --spec inventory/ct200

# The test tiers, by pytest marker (declared in tests/conftest.py): the full suite (CI, .ci/run)
# runs every tier in one session on TEST_WORKERS pytest-xdist workers (default 2, one per core
# of the CI machine): each testbed group (tests/conftest.py's TESTBED_GROUPS) on one worker with
# a fresh testbed of its own, the work that needs no llama-server handed out first while its
# build runs, the fast tests last. Measured on a fresh clone with cold caches on a 2-core
# machine: 19 to 42 min with 2 workers (by the machine), 54 min in one process
# (tests/testbed/README.md).
# TEST_WORKERS=0: one process, one testbed for the session, fast tier first.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup,)
test: lint lint-ansible
	$(PY) -m pytest $(XDIST)

# The inner loop: no root, no testbed, no llama-server build; one worker per core.
test-fast:
	$(PY) -m pytest -n auto -m "not testbed and not llama"

# llama-server on the CPU (built once per machine, cached by its source's hash).
test-llama:
	$(PY) -m pytest $(XDIST) -m llama

# The local testbed and the Ansible tests on it (root; boots systemd-nspawn machines), including
# the benchmarks' smoke runs that boot a testbed of their own.
test-testbed:
	$(PY) -m pytest $(XDIST) -m testbed

test-unit:
	$(PY) -m pytest tests/unit

docs:
	$(PY) -m ct200_tools.doctor.docs > docs/checks.md

# The release step: ct200-tools and its dependencies as wheels for the containers' Python, in one
# tar file that playbooks/container.yml installs from (ct200_tools_wheelhouse). Needs PyPI (or a
# configured index) for the dependencies. Another target: make wheelhouse WHEELHOUSE_ARGS=
# "--python-version 3.12 --glibc 2.39" (Ubuntu 24.04).
WHEELHOUSE ?= dist/ct200-tools-wheelhouse.tar
WHEELHOUSE_ARGS ?=
wheelhouse:
	$(PY) scripts/wheelhouse.py --out $(WHEELHOUSE) $(WHEELHOUSE_ARGS)
