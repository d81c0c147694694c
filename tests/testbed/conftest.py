"""Fixtures for the testbed tests: a testbed per group of test modules (tests/conftest.py's
TESTBED_GROUPS), booted fresh for the group and torn down after it, and one converge of site.yml
on it (``converged``) that the modules of the group needing a converged machine share.

Under pytest-xdist (`make test`, two workers by default: --dist loadgroup) each group runs on
a worker of its own, at the same time as the others, on a testbed of its own that starts from
machines no playbook has run on. A worker runs one group's modules to the end before it starts
the next group's, so one testbed per worker is up at a time. Without xdist (one process, `make
test TEST_WORKERS=0`) the session has one testbed, and the groups run on it one after another,
each layering on what the one before left and put back.

The testbed takes a free slot from 1 up (slot 0 is the one people bring up by hand), so a test run
never touches a testbed someone is using, and two test runs (or workers) on one machine do not
collide. Without root or the tools the tests skip with the reason, except under CI (CI=true),
where they must run: there a missing requirement fails the run instead of silently skipping it
(the ``testbed_requirements`` fixture of tests/conftest.py, shared with the benchmarks' smoke
tests).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from tbharness import CONF_200, MACHINES, REPO, SITE, AnsibleRun, Bed, Converged, pct_log, snapshot

from testbed.config import DEFAULT_MACHINES, TEST_SLOTS, MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot
from tests.conftest import testbed_group


class _Beds:
    """This worker's testbed, for the group whose modules run now; a module of another group
    takes it down and boots a fresh one (groups never see each other's machines)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.group: str | None = None
        self.bed: Bed | None = None
        self.converged: Converged | None = None
        self.stack = contextlib.ExitStack()

    def get(self, group: str) -> Bed:
        if self.bed is not None and self.group == group:
            return self.bed
        self.close()
        self.group = group
        self.bed = self._up(group)
        return self.bed

    def _up(self, group: str) -> Bed:
        settings = Settings.from_env()
        slot = claim_test_slot(settings, self.stack)
        if slot is None:
            pytest.fail(f"every test slot ({TEST_SLOTS.start}..{TEST_SLOTS.stop - 1}) is in use")
        harness = Harness(slot)
        # Registered before up: a failed or interrupted up is torn down too.
        self.stack.callback(harness.down)
        report = harness.up([MachineSpec.parse(m) for m in DEFAULT_MACHINES], fresh=True)
        print(f"\ntestbed: group {group}, slot {slot.index} up, timings {report.timings}")
        return Bed(harness, report, self.factory.mktemp(f"ansible-{group}"))

    def close(self) -> None:
        self.stack.close()
        self.stack = contextlib.ExitStack()
        self.group, self.bed, self.converged = None, None, None


@pytest.fixture(scope="session")
def _beds(testbed_requirements: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Beds]:
    beds = _Beds(tmp_path_factory)
    try:
        yield beds
    finally:
        beds.close()


@pytest.fixture(scope="module")
def testbed(_beds: _Beds, request: pytest.FixtureRequest) -> Bed:
    # One session, one worker (no pytest-xdist): one testbed for every group, in TESTBED_ORDER,
    # each group layering on what the one before left (and put back).
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _beds.get("session")
    return _beds.get(testbed_group(request.path.stem))


@pytest.fixture(scope="module")
def converged(_beds: _Beds, testbed: Bed) -> Converged:
    """The group's shared converge, made once on its fresh testbed by the first module that asks
    (tests/conftest.py orders the modules of a group: test_testbed_playbooks.py first)."""
    if _beds.converged is None:
        _beds.converged = converge(testbed)
    return _beds.converged


def converge(bed: Bed) -> Converged:
    conf_200 = bed.ssh("pve", "cat", CONF_200).stdout
    pct_before = len(pct_log(bed))
    syntax = bed.ansible(SITE, "--syntax-check")
    fresh = {m: snapshot(bed, m) for m in MACHINES}
    check_fresh = bed.ansible(SITE, "--check", "--diff")
    after_check = {m: snapshot(bed, m) for m in MACHINES}
    check_quickstart = quickstart_check(bed)
    run = bed.ansible(SITE)
    converged = {m: snapshot(bed, m) for m in MACHINES}
    pct_converge = pct_log(bed)[pct_before:]
    second = bed.ansible(SITE)
    check_after = bed.ansible(SITE, "--check", "--diff")
    done = {m: snapshot(bed, m) for m in MACHINES}
    return Converged(
        bed,
        syntax,
        fresh,
        check_fresh,
        after_check,
        run,
        converged,
        second,
        check_after,
        done,
        conf_200,
        pct_before,
        pct_converge,
        pct_log(bed)[pct_before:],
        check_quickstart,
    )


#: The spec the README's quickstart converges (scripts/quickstart.sh), and the model copy that
#: `python -m testbed llama` puts on ct before it (its staging preflight needs the directory).
QUICKSTART_SPEC = REPO / "inventory/testbed/serving.yml"
QUICKSTART_COPY = "/tank/models/tiny"


def quickstart_check(bed: Bed) -> AnsibleRun:
    """site.yml --check --diff with the quickstart's spec on the fresh machines: its validation,
    its export read by every role, its units rendered, without the llama-server build. A 4 KiB
    file stands in for the model's persistent copy; what this made is removed after."""
    made = ""  # the topmost directory this made, which the cleanup removes
    for d in ("/tank", "/tank/models", QUICKSTART_COPY):
        if bed.ssh("ct", "test", "-e", d).returncode != 0:
            made = made or d
            mkdir = bed.ssh("ct", "mkdir", d)
            assert mkdir.returncode == 0, f"{d} on a fresh ct: {mkdir.stderr}"
    assert made, f"{QUICKSTART_COPY} is there already: not a fresh ct, and not ours to remove"
    try:
        bed.ssh("ct", "dd", "if=/dev/zero", f"of={QUICKSTART_COPY}/model.gguf", "bs=4096",
                "count=1", "status=none")  # fmt: skip
        return bed.ansible(SITE, "--check", "--diff", "-e", f"@{QUICKSTART_SPEC}")
    finally:
        bed.ssh("ct", "rm", "-rf", made)
