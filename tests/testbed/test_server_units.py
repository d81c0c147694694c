"""server.unit against real systemd: transient units on the testbed's `ct` machine, read by the
doctor's own systemd probe (its `systemctl show` runs there over SSH) and judged by the check.

The server units themselves (rendered from the spec, with their gate) are the server role's
tests; this one proves the probe and the check read real unit states right: running, failed,
stopped, never installed, and one still starting.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping

import pytest
from tbharness import Bed

from ct200_tools.doctor.checks.base import Context
from ct200_tools.doctor.checks.server import JUDGES
from ct200_tools.doctor.probes.base import Ran, Reader, RunTimeout
from ct200_tools.doctor.probes.systemd import probe_units
from ct200_tools.facts import Facts, ServerFacts
from ct200_tools.serve import engines
from ct200_tools.spec import GpuSpec, ModelSpec, ServerSpec, SiteSpec
from testbed import ssh as tbssh

pytestmark = pytest.mark.testbed

NAMES = ("tb-ok", "tb-fail", "tb-stopped", "tb-starting", "tb-none")


class OnMachine(Reader):
    """The probe's commands run on a testbed machine (argv quoted word by word over SSH)."""

    def __init__(self, bed: Bed, name: str) -> None:
        super().__init__()
        self.bed, self.name = bed, name

    def run(self, argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        remote = tbssh.argv(self.bed.slot, self.bed.addresses[self.name], argv)
        try:
            # SSH's own connection is not the probe's deadline: allow it a few seconds more.
            done = subprocess.run(
                remote, capture_output=True, text=True, timeout=timeout_s + 10, check=False
            )
        except subprocess.TimeoutExpired:
            raise RunTimeout(f"{argv[0]} did not finish within {timeout_s:g} s") from None
        return Ran(done.returncode, done.stdout, done.stderr)


def ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def units(testbed: Bed) -> Iterator[Bed]:
    run = [*("systemd-run", "--unit")]
    ok(testbed.ssh("ct", *run, engines.unit_name("tb-ok"), "sleep", "600"))
    ok(testbed.ssh("ct", *run, engines.unit_name("tb-fail"), "sh", "-c", "exit 3"))
    ok(testbed.ssh("ct", *run, engines.unit_name("tb-stopped"), "sleep", "600"))
    ok(testbed.ssh("ct", "systemctl", "stop", engines.unit_name("tb-stopped")))
    starting = ("--no-block", "-p", "Type=notify", "-p", "TimeoutStartSec=600")
    ok(testbed.ssh("ct", *run, engines.unit_name("tb-starting"), *starting, "sleep", "600"))
    try:
        yield testbed
    finally:
        all_units = [engines.unit_name(n) for n in NAMES]
        testbed.ssh("ct", "systemctl", "stop", *all_units)
        testbed.ssh("ct", "systemctl", "reset-failed", *all_units)


def judge(name: str, facts: ServerFacts) -> tuple[bool | None, str, bool]:
    server = ServerSpec(name, "command", "tiny", (), 8080, 0, command=("/bin/true",))
    spec = SiteSpec(
        GpuSpec(1, "NVIDIA H200"),
        models=(ModelSpec("tiny", "/srv/models/tiny", "/dev/shm/models/tiny"),),
        servers=(server,),
    )
    v = JUDGES["server.unit"](Context(Facts(servers=(facts,)), spec), server, facts)
    return v.ok, v.summary, v.warn_only


def test_unit_states_read_from_real_systemd(units: Bed) -> None:
    names = [engines.unit_name(n) for n in NAMES]
    r = OnMachine(units, "ct")
    got = probe_units(r, names, "servers.units")
    assert r.unreadable == {}
    assert set(got) == set(names)
    verdicts = {n: judge(n, ServerFacts(n, unit=got[engines.unit_name(n)])) for n in NAMES}
    unit = engines.unit_name
    assert verdicts["tb-ok"] == (True, f"{unit('tb-ok')} is active (running)", False)
    assert got[unit("tb-ok")].main_pid and got[unit("tb-ok")].control_group
    assert verdicts["tb-fail"] == (
        False,
        f"{unit('tb-fail')} is failed (failed), result exit-code",
        False,
    )
    assert got[unit("tb-fail")].exec_main_status == 3
    # Stopped: transient units go once stopped, so it reads as never installed.
    for gone in ("tb-stopped", "tb-none"):
        assert got[unit(gone)].load_state == "not-found"
        assert verdicts[gone] == (False, f"{unit(gone)} is not installed", False)
    assert verdicts["tb-starting"] == (
        False,
        f"{unit('tb-starting')} is starting: activating (start)",
        True,  # a warning: the model may be loading
    )
