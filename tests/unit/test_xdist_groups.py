"""What pytest-xdist keeps on one worker (tests/conftest.py's group_of): a testbed group's modules
together, a testbed or llama module's tests together (their module fixtures boot machines or
start servers once), every other test free to go to any worker."""

from __future__ import annotations

from tests.conftest import TESTBED_GROUPS, group_of


def test_a_groups_modules_share_one_worker() -> None:
    groups = {group_of(f"tests/testbed/{m}.py::test_x") for m in TESTBED_GROUPS["converge"]}
    assert groups == {"testbed group converge"}
    assert group_of("tests/testbed/test_fault_matrix.py::test_a[x]") == "testbed group matrix"


def test_a_testbed_module_outside_the_groups_is_one_group_of_its_own() -> None:
    a = group_of("tests/testbed/test_fleet_doctor.py::test_one")
    b = group_of("tests/testbed/test_fleet_doctor.py::test_two")
    assert a == b == "testbed group test_fleet_doctor"
    assert a != group_of("tests/testbed/test_recovery.py::test_one")


def test_a_llama_module_stays_together_and_fast_tests_go_anywhere() -> None:
    assert group_of("tests/llama/test_x.py::test_a") == group_of("tests/llama/test_x.py::test_b")
    assert group_of("tests/unit/test_x.py::test_a") == "tests/unit/test_x.py::test_a"
    assert group_of("tests/unit/test_x.py::test_b") != group_of("tests/unit/test_x.py::test_a")
