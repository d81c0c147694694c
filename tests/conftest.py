"""Settings for every test directory: the hypothesis profiles, and what the testbed needs.

Hypothesis fails an example that takes longer than its deadline (200 ms by default). On a busy
machine (CI, or two cores shared with other work) a parser test then fails for the load, not for
the code, so no profile here has a deadline. A test that must bound a duration says so itself.

    HYPOTHESIS_PROFILE=ci    the same examples on every run (derandomized), for a CI that must
                             not turn red on a new random example nobody can reproduce at once

Loaded here, before pytest imports any test module: ``@settings(max_examples=...)`` on a test
takes every setting it does not name from the profile loaded at import time.

The tiers, declared here from the markers (pyproject.toml) and run by the Makefile:

    fast      no mark (and ``gpu``, which skips without a GPU): `make test-fast`, the inner loop
    testbed   root, systemd-nspawn machines and Ansible: `make test-testbed`
    llama     builds (cached) and runs llama-server on the CPU: `make test-llama`

`make test` (CI) runs them all in one session, in that order: a fast failure shows first, and the
slow tiers' caches (the testbed's rootfs and wheelhouse, llama-server) build in the background
while the fast tier runs, on the core it leaves idle (``WARM``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from testbed import llama_build
from testbed.config import Settings
from testbed.harness import unmet

settings.register_profile("default", deadline=None, print_blob=True)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def testbed_requirements() -> None:
    """Skips a test that boots testbed machines where it cannot (not root, tools missing), with
    the reason; under CI (CI=true) fails it instead, so CI cannot skip those tests silently."""
    reason = unmet(Settings.from_env(), Path(sys.executable).parent)
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the testbed tests, but {reason}", pytrace=False)
    pytest.skip(reason)


#: The tiers in the order a full run runs them (see the module's docstring): llama last, so that
#: a llama-server build still running when the fast tier ends holds up only what needs it.
TIERS = ("fast", "testbed", "llama")


def tier(item: pytest.Item) -> str:
    for name in ("testbed", "llama"):
        if item.get_closest_marker(name) is not None:
            return name
    return "fast"


#: The testbed modules that share the session's testbed, in the order they run. The first one
#: makes the shared converge (tests/testbed/conftest.py) on machines no playbook has run on; the
#: modules after it layer on it and put back what they change (the host modules before the ones
#: that start from a pristine pve). The three that push llama-server come last, so that its
#: build overlaps the others. Modules not named (their own slots) run after these.
TESTBED_ORDER = (
    "test_testbed_playbooks",
    "test_host_roles",
    "test_host_chain",
    "test_host_doctor",
    "test_staging_role",
    "test_server_units",
    "test_testbed_harness",
    "test_recovery",
    "test_servers",
    "test_bench_managed",
    "test_fault_matrix",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: within a tier (and a testbed module), the files' order stays as it was.
    rank = {name: i for i, name in enumerate(TIERS)}
    order = {name: i for i, name in enumerate(TESTBED_ORDER)}

    def key(item: pytest.Item) -> tuple[int, int]:
        t = tier(item)
        return rank[t], order.get(item.path.stem, len(order)) if t == "testbed" else 0

    items.sort(key=key)


#: What warms the slow tiers' caches: the testbed's rootfs and wheelhouse (`python -m testbed
#: build`, root only) and llama-server (testbed/llama_build.py). Both take a lock and rename a
#: finished build into place, so a test that needs one before it is done waits for it, and a
#: warm-up that failed or was stopped leaves nothing the tests would take for finished: they
#: build it themselves and report why not.
WARM = """
import subprocess, sys
from testbed import llama_build
if sys.argv[1] == "1":
    subprocess.run([sys.executable, "-m", "testbed", "build"], check=False)
if sys.argv[2] == "1":
    print(llama_build.ensure(), flush=True)
"""


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the warm-up when this session runs fast tests before slow ones that need caches."""
    config = session.config
    tiers = {tier(item) for item in session.items}
    if config.option.collectonly or "fast" not in tiers or tiers == {"fast"}:
        return
    if os.environ.get("CT200_NO_WARMUP"):
        return
    testbed = "testbed" in tiers and unmet(Settings.from_env(), Path(sys.executable).parent) is None
    # test_servers.py and test_recovery.py push llama-server into the testbed.
    llama = not llama_build.missing_tools() and (testbed or "llama" in tiers)
    if not (testbed or llama):
        return
    log = Path(str(config.rootpath)) / ".testbed" / "warm-caches.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", WARM, str(int(testbed)), str(int(llama))],
            cwd=config.rootpath,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    config.stash[_WARMUP] = proc
    print(f"\nwarming the slow tiers' caches in the background (pid {proc.pid}, log {log})")


_WARMUP = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A warm-up still running when the session ends (it stopped early) is stopped: its lock
    goes with it, and its unfinished build is left as one (removed by the next build)."""
    proc = session.config.stash.get(_WARMUP, None)
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
