"""Fixtures for the testbed tests: one testbed per test run (session scope), torn down at the end,
and one converge of site.yml on it (``converged``) that the modules needing a converged machine
share.

The testbed takes a free slot from 1 up (slot 0 is the one people bring up by hand), so a test run
never touches a testbed someone is using, and two test runs on one machine do not collide.
Without root or the tools the tests skip with the reason, except under CI (CI=true), where they
must run: there a missing requirement fails the run instead of silently skipping it (the
``testbed_requirements`` fixture of tests/conftest.py, shared with the benchmarks' smoke tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from tbharness import CONF_200, MACHINES, SITE, Bed, Converged, pct_log, snapshot

from testbed.config import DEFAULT_MACHINES, TEST_SLOTS, MachineSpec, Settings
from testbed.harness import Harness, claim_test_slot


@pytest.fixture(scope="session")
def testbed(testbed_requirements: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    settings = Settings.from_env()
    with contextlib.ExitStack() as stack:
        slot = claim_test_slot(settings, stack)
        if slot is None:
            pytest.fail(f"every test slot ({TEST_SLOTS.start}..{TEST_SLOTS.stop - 1}) is in use")
        harness = Harness(slot)
        # Registered before up: a failed or interrupted up is torn down too.
        stack.callback(harness.down)
        report = harness.up([MachineSpec.parse(m) for m in DEFAULT_MACHINES], fresh=True)
        print(f"\ntestbed: slot {slot.index} up, timings {report.timings}")
        yield Bed(harness, report, tmp_path_factory.mktemp("ansible"))


@pytest.fixture(scope="session")
def converged(testbed: Bed) -> Converged:
    """The shared converge. tests/conftest.py runs test_testbed_playbooks.py, its first user,
    before any module that changes a machine, so "fresh" means no playbook has run there."""
    bed = testbed
    conf_200 = bed.ssh("pve", "cat", CONF_200).stdout
    pct_before = len(pct_log(bed))
    syntax = bed.ansible(SITE, "--syntax-check")
    fresh = {m: snapshot(bed, m) for m in MACHINES}
    check_fresh = bed.ansible(SITE, "--check", "--diff")
    after_check = {m: snapshot(bed, m) for m in MACHINES}
    converge = bed.ansible(SITE)
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
        converge,
        converged,
        second,
        check_after,
        done,
        conf_200,
        pct_before,
        pct_converge,
        pct_log(bed)[pct_before:],
    )
