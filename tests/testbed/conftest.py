"""Fixtures for the testbed tests: one testbed per test run (session scope), torn down at the end.

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
from tbharness import Bed

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
