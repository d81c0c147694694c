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

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


#: The testbed modules by group, in the order they run. In one process the groups share the
#: session's testbed, one after another; under pytest-xdist (`make test`, TEST_WORKERS=2 by default:
#: -n N --dist loadgroup) each group gets a fresh testbed of its own (tests/testbed/conftest.py) and
#: runs on one worker, at the same time as the other groups: the groups are independent, the modules
#: within one are not. In "converge", the first module makes the shared converge on machines no
#: playbook has run on; the modules after it layer on it and put back what they change (the host
#: modules before the ones that start from a pristine pve). "llama" pushes llama-server (its build
#: overlaps the other groups). A testbed module not named here is a group of its own; the
#: benchmarks' smoke tests boot testbeds of their own.
TESTBED_GROUPS = {
    "converge": (
        "test_testbed_playbooks",
        "test_host_roles",
        "test_host_chain",
        "test_host_doctor",
        "test_staging_role",
        "test_server_units",
        "test_testbed_harness",
    ),
    "llama": (
        "test_recovery",
        "test_servers",
        "test_bench_managed",
        "test_bench_day_managed",
        "test_converge",
    ),
    "matrix": ("test_fault_matrix",),
}
TESTBED_ORDER = tuple(m for modules in TESTBED_GROUPS.values() for m in modules)


def testbed_group(module: str) -> str:
    """The group of a testbed test module (by its file's stem)."""
    for group, modules in TESTBED_GROUPS.items():
        if module in modules:
            return group
    return module


#: The testbed work that pushes or starts llama-server: under pytest-xdist it is handed out after
#: the work that does not, so the build (started with the session) is done or nearly by then.
LLAMA_GROUPS = ("llama", "matrix")
LLAMA_SMOKES = ("test_servers_benchmark", "test_recovery_benchmark")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: within a tier (and a testbed module), the files' order stays as it was.
    rank = {name: i for i, name in enumerate(TIERS)}
    order = {name: i for i, name in enumerate(TESTBED_ORDER)}

    def key(item: pytest.Item) -> tuple[int, int]:
        t = tier(item)
        return rank[t], order.get(item.path.stem, len(order)) if t == "testbed" else 0

    def parallel(item: pytest.Item) -> tuple[int, int]:
        # The scheduler hands out work in this order (no reordering by size): first the testbed
        # work that needs no llama-server, then what does, then the llama tier; the fast tests
        # last, many small pieces that fill the workers' ends.
        t = tier(item)
        if t != "testbed":
            return (3 if t == "fast" else 2), 0
        llama = testbed_group(item.path.stem) in LLAMA_GROUPS or item.name in LLAMA_SMOKES
        return int(llama), order.get(item.path.stem, len(order))

    items.sort(key=parallel if "PYTEST_XDIST_WORKER" in os.environ else key)


def group_of(nodeid: str) -> str:
    """pytest-xdist's unit of work for a test: its testbed group (every module of a group on one
    worker, in order), or the test alone. By node id, which is all a scheduler sees."""
    path = nodeid.split("::", 1)[0]
    stem = Path(path).stem
    # A testbed module outside the groups (the fleet doctor's) is a group of its own, and a llama
    # module stays on one worker: their module fixtures boot machines or start servers once.
    if Path(path).parent.name == "testbed" and stem.startswith("test_"):
        return f"testbed group {testbed_group(stem)}"
    if Path(path).parent.name == "llama":
        return f"module {path}"
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by our groups. xdist's own loadgroup reads `xdist_group` marks into
    node ids, which pytest 9 no longer lets a plugin change; a scheduler that asks group_of()
    needs no marks (the grouped modules' other tests, the fast ones, just come along)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only under xdist

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # In collection order (pytest_collection_modifyitems), not the largest groups first.
    config.option.loadscopereorder = False
    return ByGroup(config, log)


#: What warms the slow tiers' caches: the testbed's rootfs and wheelhouse (`python -m testbed
#: build`, root only) and llama-server (testbed/llama_build.py). Both take a lock and rename a
#: finished build into place, so a test that needs one before it is done waits for it, and a
#: warm-up that failed or was stopped leaves nothing the tests would take for finished: they
#: build it themselves and report why not.
WARM = """
import os, subprocess, sys
from testbed import llama_build
# Ahead of the test workers, where it may (root): the testbed groups that push llama-server
# wait for this build, and on 2 cores busy with four workers it took 1472 s, not about 360.
try:
    os.setpriority(os.PRIO_PROCESS, 0, -5)
except OSError:
    pass
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
    # Under pytest-xdist every worker collects: the first one warms up, for all of them.
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
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
_WARMUP_PID = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A warm-up still running when the session ends (it stopped early) is stopped: its lock
    goes with it, and its unfinished build is left as one (removed by the next build). Under
    pytest-xdist the worker that started it hands its pid to the controller, which stops it once
    every worker is done (a worker done early must not stop a build the others wait for)."""
    config = session.config
    proc = config.stash.get(_WARMUP, None)
    workeroutput = getattr(config, "workeroutput", None)
    if proc is not None and workeroutput is not None:
        if proc.poll() is None:
            workeroutput["ct200_warmup_pid"] = proc.pid
        return
    if proc is not None:
        if proc.poll() is None:
            _stop(proc.pid, proc.wait)
        return
    pid = config.stash.get(_WARMUP_PID, None)
    if pid is not None:
        _stop(pid, lambda timeout: _wait_gone(pid, timeout))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, on the controller: a worker ended; keep the pid of its running warm-up."""
    pid = getattr(node, "workeroutput", {}).get("ct200_warmup_pid")
    if isinstance(pid, int):
        node.config.stash[_WARMUP_PID] = pid


def _stop(pid: int, wait: Callable[[float], object]) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _wait_gone(pid: int, timeout: float) -> None:
    """Waits for a process group that is not our child (the controller's view of a worker's
    warm-up) to end; TimeoutExpired after `timeout`."""
    for _ in range(int(timeout * 10)):
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise subprocess.TimeoutExpired(str(pid), timeout)
