"""The fault matrix of issue 19 on the testbed, with real reboots: each fault a user meets after a
host reboot, and for each, that the boot chain (`ct200-serve chain`, text and --json), the boot
textfile (this boot's id), the doctor and `systemctl status` say the truth; that the fix the tools
print, pasted literally (taken from their own output, run by `bash -c` over ssh on the machine it
names, or on the controller when it says so), repairs it; and that recover.yml repairs it, a
second run changing nothing.

The site is a real one of the test's own (an inventory whose group_vars hold it, so the
commands the machines print, which name the inventory that provisioned them, paste as they are):
the testbed's spec with six llama-server `command` servers on distinct ports, one per fault that
hits a server, so independent faults share one boot and each is asserted on its own step.

Boots (each a real power cycle: /dev/shm and /run start empty, systemd boots anew):

1. both machines, with `ct200-host-devices` disabled on pve, tiny-b's persistent copy moved
   away (fm-copy), a listener on fm-port's port started at boot; then, on the booted machine,
   fm-trunc's staged copy truncated and fm-same's changed at the same size (each server then
   restarted, as a crash would), fm-kill's engine killed three times in a row, fm-stop stopped
   by hand. What each tool says is recorded; then the printed fixes are pasted, the chain's
   until it serves, the host chain's on pve.
2. both machines, the same faults again, with `ct200-pcie-tune` disabled and
   `ct200-host-devices` failing (a STAND-IN GPU on the PCI bus the real script cannot load a
   driver for, as tests/testbed/test_host_chain.py): recover.yml while the causes outside its
   reach are still there (a missing copy, a foreign listener, a host without the driver) names
   them; with those causes gone it repairs everything; a second run changes nothing.
3. the container, with /etc/ct200/site.yml unparsable.
4. the container, with /dev/shm too small for the models (its fstab line shrunk).
5. the container, with nothing enabled to serve (an empty serving set).

Which defect each row guards against, and the commit that fixed it (older main fails there):
unparsable spec: the stale green textfile (74aa445), no fix that writes the spec again and
recover.yml not repairing it (this branch: 4344d66, 73b25f4); persistent copy missing: the
recover.yml command without -i (7909587); staged copy truncated / changed at the same size:
the refused or "already staged" restage and the same-size change served (30be040, 8308c66);
engine killed three times: three good restarts leaving it down (378dd58), `systemctl status`
saying "serving" in the restart delay (this branch: 15fd5d7); port taken: the status line kept
"preflight passed; starting" (fa27ee7); server stopped by hand: named "not started at boot"
(41be238); host boot unit disabled / failing: the fix with INVENTORY and HOST to fill in
(bf9faa5); /dev/shm too small: no whole fix and recover.yml not repairing it (7413e3c,
73b25f4); nothing enabled: said serving, exit 0 (74aa445, 2eada2a).

Time: a provisioning site.yml, two reboots of both machines, four of the container, seven
recover.yml runs; about 22 minutes on a 2-core machine under load (see the report).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import VENV_BIN, AnsibleRun, Bed
from test_host_chain import NO_STANDIN, STANDIN_GPU
from test_host_roles import HOST_CHAIN, HOST_TEXTFILE
from test_host_roles import restore as restore_pve
from test_servers import CLEANUP, DOCTOR, SERVE, setup

from ct200_tools.serve import engines as engine
from testbed.machine import hostname
from tests.server_sites import SHM_SIZE, TESTBED_SPEC, llama, model

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(1800)]

SITE = "playbooks/site.yml"
RECOVER = "playbooks/recover.yml"
CT, PVE = hostname("ct"), hostname("pve")
TEXTFILE = "/var/lib/prometheus/node-exporter/ct200_boot.prom"
SPEC = "/etc/ct200/site.yml"
DEVICES = "ct200-host-devices.service"
TUNE = "ct200-pcie-tune.service"
#: Bounds for the polls, not expectations.
DEADLINE_S = 150.0

#: The servers of the matrix: name -> (model, port). Each fault that hits a server has its own.
SERVERS = {
    "fm-copy": ("tiny-b", 8090),
    "fm-port": ("tiny-a", 8091),
    "fm-trunc": ("fm-c", 8092),
    "fm-same": ("fm-d", 8093),
    "fm-kill": ("tiny-a", 8094),
    "fm-stop": ("tiny-a", 8095),
}
#: Persistent copies the test writes beside those of tests/server_sites.py (name -> seed).
EXTRA_MODELS = {"fm-c": 4, "fm-d": 5}
KEPT = "/root/tiny-b.kept-by-fault-matrix"
SQUATTER = "ct200-test-squatter.service"
SQUATTER_UNIT = f"""[Unit]
Description=A foreign listener on the port of fm-port, test_fault_matrix
Before={engine.unit_name("fm-port")}

[Service]
ExecStart=/usr/bin/python3 -m http.server {SERVERS["fm-port"][1]} --bind 127.0.0.1

[Install]
WantedBy=multi-user.target
"""
COMPLETE = r"""
import json, sys, urllib.request
out = {}
for port in sys.argv[1:]:
    body = json.dumps({"prompt": "Hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            out[port] = resp.status
    except Exception as exc:
        out[port] = repr(exc)
print(json.dumps(out))
"""
SHOW = "ActiveState,SubState,Result,UnitFileState,NRestarts,MainPID,StatusText"


def unit(name: str) -> str:
    return engine.unit_name(name)


def matrix_site() -> dict[str, Any]:
    """The group_vars of the matrix's inventory: the testbed's spec with the six servers, and
    recover.yml's final doctor per server (a site without GPUs says so, as the runbook says:
    the full doctor fails there on the driver checks by design)."""
    data = yaml.safe_load(TESTBED_SPEC.read_text())
    data["recover_doctor"] = "servers"
    site: dict[str, Any] = data["ct200_site"]
    site["models"] = [model(m) for m in ("tiny-a", "tiny-b", *EXTRA_MODELS)]
    site["shm"] = {"size": SHM_SIZE}
    site["servers"] = [
        llama(name, m, port, alias=name, enabled=True) for name, (m, port) in SERVERS.items()
    ]
    return dict(data)


# -- reading the machines --------------------------------------------------------------------------


def sh(bed: Bed, name: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return bed.ssh(name, "bash", "-c", script, timeout=timeout)


def show(bed: Bed, name: str, which: str = "ct") -> dict[str, str]:
    proc = bed.ssh(which, "systemctl", "show", f"--property={SHOW}", name)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def completions(bed: Bed, names: Sequence[str] = tuple(SERVERS)) -> dict[str, Any]:
    ports = [str(SERVERS[n][1]) for n in names]
    proc = bed.ssh("ct", "python3", "-c", COMPLETE, *ports, timeout=200)
    got = json.loads(proc.stdout) if proc.returncode == 0 else {}
    return {n: got.get(str(SERVERS[n][1]), proc.stderr) for n in names}


@dataclass
class Said:
    """What the tools say on a machine at one moment."""

    chain_rc: int
    chain_text: str
    chain: dict[str, Any]
    textfile: str
    boot_id: str
    status: dict[str, str] = field(default_factory=dict)
    doctor: dict[str, tuple[int, str]] = field(default_factory=dict)
    units: dict[str, dict[str, str]] = field(default_factory=dict)

    def step(self, kind: str, name: str) -> dict[str, Any]:
        return next(
            (s for s in self.chain.get("steps", []) if (s["kind"], s["name"]) == (kind, name)), {}
        )


def chain_json(bed: Bed, which: str = "ct") -> tuple[int, dict[str, Any]]:
    if which == "pve":
        proc = bed.ssh("pve", HOST_CHAIN, "--json")
        key = None
    else:
        proc = bed.ssh("ct", SERVE, "chain", "--json", timeout=300)
        key = "result"
    try:
        got = json.loads(proc.stdout)
        return proc.returncode, dict(got[key] if key else got)
    except (ValueError, KeyError):
        return proc.returncode, {"unparsed": proc.stdout + proc.stderr}


def said(bed: Bed, which: str = "ct", servers: Sequence[str] = ()) -> Said:
    text_cmd = [HOST_CHAIN] if which == "pve" else [SERVE, "chain"]
    text = bed.ssh(which, *text_cmd, timeout=300)
    rc, got = chain_json(bed, which)
    units = [DEVICES, TUNE] if which == "pve" else [unit(s) for s in servers]
    return Said(
        text.returncode,
        text.stdout + text.stderr,
        got if rc == text.returncode else {**got, "rc_differs": rc},
        bed.ssh(which, "cat", HOST_TEXTFILE if which == "pve" else TEXTFILE).stdout,
        bed.ssh(which, "cat", "/proc/sys/kernel/random/boot_id").stdout.strip(),
        {
            u: bed.ssh(which, "systemctl", "status", "--no-pager", "--lines=20", u).stdout
            for u in units
        },
        {s: _doctor(bed, s) for s in servers},
        {u: show(bed, u, which) for u in units},
    )


def _doctor(bed: Bed, server: str) -> tuple[int, str]:
    proc = bed.ssh("ct", DOCTOR, "check", "--server", server, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def wait_for(bed: Bed, names: Sequence[str], states: Sequence[str]) -> dict[str, dict[str, str]]:
    """Polls until each server unit is in one of ``states`` (failed: after its start limit, no
    restart pending), or the deadline passes (the tests then see the state it had)."""
    until = time.monotonic() + DEADLINE_S
    got: dict[str, dict[str, str]] = {}
    while time.monotonic() < until:
        got = {n: show(bed, unit(n)) for n in names}
        if all(g.get("ActiveState") in states for g in got.values()):
            return got
        time.sleep(2)
    return got


# -- pasting the printed fixes -----------------------------------------------------------------

_QUOTED = re.compile(r"`([^`]+)`")
#: Commands a fix line shows to read more, not to repair.
_DIAGNOSTIC = ("journalctl", "ct200-serve chain", "ct200-doctor", "systemctl status", "cat ")


def printed_fixes(text: str) -> list[str]:
    """The repairing commands a tool printed, in the order to paste them, each once: first the
    doctor's (`$ command` lines: the root cause's fix), then every command in backquotes on a
    line that says fix; not those that only read (journalctl, ...) nor the controller's
    playbook alternative."""
    doctor = [ln.strip()[2:] for ln in text.splitlines() if ln.strip().startswith("$ ")]
    quoted = [c for ln in text.splitlines() if "fix" in ln for c in _QUOTED.findall(ln)]
    out: list[str] = []
    for cmd in (*doctor, *quoted):
        if cmd.startswith(_DIAGNOSTIC) or "ansible-playbook" in cmd or cmd in out:
            continue
        out.append(cmd)
    return out


def controller_command(text: str, playbook: str) -> str:
    """The whole playbook command a machine printed, to paste on the controller."""
    for cmd in _QUOTED.findall(text):
        if "ansible-playbook" in cmd and playbook in cmd:
            return cmd
    return ""


@dataclass
class Paste:
    where: str
    command: str
    rc: int
    output: str
    #: The step the chain had stopped at when the command was printed (kind name).
    stopped_at: str = ""


def paste(bed: Bed, where: str, command: str, stopped_at: str = "") -> Paste:
    """The command as printed, run by bash -c: over ssh on a machine, or on the controller."""
    if where == "controller":
        env = {"PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_NOCOLOR": "1"}
        proc = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
    else:
        proc = sh(bed, where, command)
    return Paste(where, command, proc.returncode, (proc.stdout + proc.stderr)[-3000:], stopped_at)


def follow_chain_fixes(bed: Bed, limit: int = 20) -> list[Paste]:
    """`ct200-serve chain`, its printed fixes pasted, again, until it serves (or ``limit``)."""
    pasted: list[Paste] = []
    for _ in range(limit):
        proc = bed.ssh("ct", SERVE, "chain", timeout=300)
        if proc.returncode == 0:
            break
        text = proc.stdout + proc.stderr
        at = next((ln for ln in text.splitlines() if ln.startswith("stopped at: ")), "")
        at = " ".join(at.removeprefix("stopped at: ").split()[:2])
        cmds = printed_fixes(text)
        if not cmds:
            pasted.append(Paste("ct", "", -1, text[-3000:], at))
            break
        pasted += [paste(bed, "ct", c, at) for c in cmds]
    return pasted


# -- the faults ----------------------------------------------------------------------------------


def break_before_boot(bed: Bed, host_unit_off: str) -> None:
    """The faults that must be there when the machines boot."""
    for name, script in (
        ("pve", f"systemctl disable {host_unit_off}"),
        ("ct", f"mv /tank/models/tiny-b {KEPT}"),
        (
            "ct",
            f"printf '%s' {shlex.quote(SQUATTER_UNIT)} > /etc/systemd/system/{SQUATTER}"
            f" && systemctl daemon-reload && systemctl enable {SQUATTER}",
        ),
    ):
        done = sh(bed, name, script)
        assert done.returncode == 0, (script, done.stderr)


def kill_three_times(bed: Bed) -> list[dict[str, Any]]:
    """fm-kill's engine killed with SIGKILL three times in a row, each once it served again;
    what systemctl and the doctor say during the first restart."""
    seen: list[dict[str, Any]] = []
    for i in range(3):
        pid = show(bed, unit("fm-kill"))["MainPID"]
        sh(bed, "ct", f"kill -9 {pid}")
        if i == 0:
            # In the restart delay (RestartSec), once its ExecStopPost ran (bounded).
            until = time.monotonic() + 8
            while time.monotonic() < until:
                now = show(bed, unit("fm-kill"))
                if now["SubState"] == "auto-restart" and not now["StatusText"].startswith("serv"):
                    break
                time.sleep(0.3)
            seen.append(
                {
                    "show": show(bed, unit("fm-kill")),
                    "status": bed.ssh(
                        "ct", "systemctl", "status", "--no-pager", unit("fm-kill")
                    ).stdout,
                    "doctor": _doctor(bed, "fm-kill"),
                }
            )
        until = time.monotonic() + DEADLINE_S
        while time.monotonic() < until:
            now = show(bed, unit("fm-kill"))
            if now["ActiveState"] == "active" and now["MainPID"] not in ("0", pid):
                break
            time.sleep(1)
    return seen


def break_after_boot(bed: Bed) -> list[dict[str, Any]]:
    """The faults of a running machine: damaged staged copies (each server restarted, as a
    crash would), a server killed three times, a server stopped by hand."""
    for script in (
        "truncate -s 1000 /dev/shm/models/fm-c/model.gguf",
        # One byte changed, the size kept: only the marker's (inode, size, mtime, ctime) can tell.
        "printf 'X' | dd of=/dev/shm/models/fm-d/model.gguf bs=1 seek=4096 conv=notrunc"
        " status=none",
        f"systemctl restart {unit('fm-trunc')} {unit('fm-same')}; true",
        f"systemctl stop {unit('fm-stop')}",
    ):
        done = sh(bed, "ct", script)
        assert done.returncode == 0, (script, done.stderr)
    kills = kill_three_times(bed)
    wait_for(bed, ["fm-trunc", "fm-same", "fm-copy", "fm-port"], ["failed"])
    return kills


def remove_causes(bed: Bed, every: bool = True) -> None:
    """What no tool can do for the user: the copy restored from backup; with ``every``, the
    foreign listener stopped for good, the driver installed (the stand-in GPU gone)."""
    sh(bed, "ct", f"test -e {KEPT} && mv {KEPT} /tank/models/tiny-b; true")
    if every:
        sh(bed, "ct", f"systemctl disable --now {SQUATTER}; true")
        sh(bed, "pve", NO_STANDIN)


def dump(name: str, got: Any) -> Any:
    """What the tools said, kept beside the run's other files for reading after a failure."""
    out = Path("/tmp") / f"fault-matrix-{name.replace('/', '').replace(' ', '-')}.json"
    out.write_text(json.dumps(_plain(got), indent=1, default=str))
    return got


def _plain(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return {k: _plain(getattr(x, k)) for k in x.__dataclass_fields__}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# -- the sequence --------------------------------------------------------------------------------


@dataclass
class Provisioned:
    bed: Bed
    inventory: Path
    run: AnsibleRun


@dataclass
class BootOne:
    reboot: Any
    ct: Said
    pve: Said
    kills: list[dict[str, Any]]
    completions: dict[str, Any]
    pasted: list[Paste]
    host_pasted: list[Paste]
    after: Said
    after_pve: Said
    completions_after: dict[str, Any]


@dataclass
class BootTwo:
    ct: Said
    pve: Said
    host_pasted: list[Paste]
    pve_pasted: Said
    blocked: AnsibleRun
    recover: AnsibleRun
    again: AnsibleRun
    after: Said
    after_pve: Said
    completions_after: dict[str, Any]


@pytest.fixture(scope="module")
def provisioned(testbed: Bed) -> Iterator[Provisioned]:
    bed = testbed
    conf_200 = bed.ssh("pve", "cat", "/etc/pve/lxc/200.conf").stdout
    setup(bed)
    try:
        from testbed import tiny_gguf  # noqa: PLC0415 - numpy and gguf only here

        for name, seed in EXTRA_MODELS.items():
            gguf = tiny_gguf.write(bed.workdir / f"{name}.gguf", seed=seed)
            bed.push("ct", gguf, f"/tank/models/{name}/model.gguf", 0o644)
        inv = bed.workdir / "fault-matrix-inventory"
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        (inv / "hosts.yml").write_text(Path(bed.inventory).read_text())
        (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(matrix_site(), sort_keys=False))
        run = bed.ansible(SITE, inventory=inv / "hosts.yml")
        assert run.rc == 0, run.describe()
        yield Provisioned(bed, inv / "hosts.yml", run)
    finally:
        remove_causes(bed)
        bed.ssh(
            "ct",
            "sh",
            "-c",
            f"rm -f /etc/systemd/system/{SQUATTER}; {CLEANUP}",
        )
        sh(bed, "pve", f"systemctl enable {DEVICES} {TUNE}; {NO_STANDIN}")
        restore_pve(bed, conf_200)


@pytest.fixture(scope="module")
def boot_one(provisioned: Provisioned) -> BootOne:
    bed = provisioned.bed
    break_before_boot(bed, DEVICES)
    reboot = bed.reboot()
    wait_for(bed, ["fm-copy", "fm-port"], ["failed"])
    wait_for(bed, ["fm-trunc", "fm-same", "fm-kill", "fm-stop"], ["active"])
    kills = break_after_boot(bed)
    ct = said(bed, "ct", tuple(SERVERS))
    pve = said(bed, "pve")
    got = completions(bed)
    # The printed fixes, pasted: the causes no tool can remove first (the copy back, the
    # listener stopped), then the chain's fixes until it serves; the host chain's on pve.
    remove_causes(bed, every=False)
    pasted = follow_chain_fixes(bed)
    host_pasted = [paste(bed, "pve", c, "host") for c in printed_fixes(pve.chain_text)]
    return dump(
        "boot-one",
        BootOne(
            reboot,
            ct,
            pve,
            kills,
            got,
            pasted,
            host_pasted,
            said(bed, "ct", tuple(SERVERS)),
            said(bed, "pve"),
            completions(bed),
        ),
    )


@pytest.fixture(scope="module")
def boot_two(provisioned: Provisioned) -> BootTwo:
    """The same faults, left to recover.yml; the host's units: one disabled, one failing."""
    bed = provisioned.bed
    break_before_boot(bed, TUNE)
    standin = sh(bed, "pve", STANDIN_GPU)
    assert standin.returncode == 0, standin.stderr
    bed.reboot()
    wait_for(bed, ["fm-copy", "fm-port"], ["failed"])
    wait_for(bed, ["fm-trunc", "fm-same", "fm-kill", "fm-stop"], ["active"])
    break_after_boot(bed)
    ct = said(bed, "ct")
    pve = said(bed, "pve")
    args = ("-e", "recover_doctor=servers")
    inv = provisioned.inventory
    blocked = bed.ansible(RECOVER, *args, inventory=inv)
    remove_causes(bed)
    # The failing host unit's printed fix, pasted once its cause (no driver) is gone.
    host_pasted = [paste(bed, "pve", c, "host") for c in printed_fixes(pve.chain_text)]
    pve_pasted = said(bed, "pve")
    recover = bed.ansible(RECOVER, *args, inventory=inv)
    again = bed.ansible(RECOVER, *args, inventory=inv)
    return dump(
        "boot-two",
        BootTwo(
            ct,
            pve,
            host_pasted,
            pve_pasted,
            blocked,
            recover,
            again,
            said(bed, "ct", tuple(SERVERS)),
            said(bed, "pve"),
            completions(bed),
        ),
    )


@dataclass
class Alone:
    """A fault that hits every server at once, alone in its boot of the container: what the
    tools say, the printed fixes pasted; then the fault again, another boot, and recover.yml."""

    ct: Said
    report_unit: dict[str, str]
    pasted: list[Paste]
    after_paste: Said
    completions_after_paste: dict[str, Any]
    recover: AnsibleRun
    again: AnsibleRun
    after_recover: Said
    completions_after: dict[str, Any]


#: What each single fault does to the container before its boot.
ALONE = {
    "unparsable spec": f"printf 'ct200_site:\\n  servers: [\\n' > {SPEC}",
    "/dev/shm too small": "sed -i 's#^tmpfs /dev/shm tmpfs .*#tmpfs /dev/shm tmpfs"
    " rw,nosuid,nodev,size=64K 0 0#' /etc/fstab",
    # What stopping everything leaves (switch needs a NAME): an empty set, every unit disabled.
    "nothing enabled to serve": "mkdir -p /var/lib/ct200 && printf '%s\\n' "
    + shlex.quote(json.dumps({"kind": "ct200-serving-set", "schema_version": 1, "servers": []}))
    + " > /var/lib/ct200/serving.json && systemctl disable --now"
    + "".join(f" {unit(n)}" for n in SERVERS),
}


def follow_fixes(bed: Bed) -> list[Paste]:
    """The chain's printed fixes until it serves; where it printed only a playbook command for
    the controller, that command (once), then the chain's again."""
    pasted = follow_chain_fixes(bed)
    if pasted and pasted[-1].command == "":
        last = pasted.pop()
        cmd = controller_command(last.output, ".yml")
        if not cmd:
            return [*pasted, last]
        pasted.append(paste(bed, "controller", cmd, last.stopped_at))
        pasted += follow_chain_fixes(bed)
    return pasted


def alone(provisioned: Provisioned, fault: str) -> Alone:
    bed = provisioned.bed

    def boot(again: bool = False) -> None:
        done = sh(bed, "ct", ALONE[fault])
        assert done.returncode == 0, done.stderr
        # An empty serving set is the same state without a boot: recover.yml's check of it
        # needs none (the first boot showed the boot's part).
        if not (again and fault == "nothing enabled to serve"):
            bed.reboot("ct")
        wait_for(bed, list(SERVERS), ["failed", "inactive"])

    boot()
    ct = said(bed, "ct", tuple(SERVERS))
    report_unit = show(bed, "ct200-boot-report.service")
    pasted = follow_fixes(bed)
    after_paste = said(bed, "ct")
    got_after_paste = completions(bed)
    if fault == "nothing enabled to serve":
        # Back to the matrix's set (the fix chose one server).
        sh(bed, "ct", f"{SERVE} switch --exact {' '.join(SERVERS)}")
    boot(again=True)
    args = ("-e", "recover_doctor=servers")
    recover = bed.ansible(RECOVER, *args, inventory=provisioned.inventory)
    again = bed.ansible(RECOVER, *args, inventory=provisioned.inventory)
    if fault == "nothing enabled to serve":
        sh(bed, "ct", f"{SERVE} switch --exact {' '.join(SERVERS)}")
    return dump(
        fault,
        Alone(
            ct,
            report_unit,
            pasted,
            after_paste,
            got_after_paste,
            recover,
            again,
            said(bed, "ct"),
            completions(bed),
        ),
    )


@pytest.fixture(scope="module")
def unparsable(provisioned: Provisioned) -> Alone:
    return alone(provisioned, "unparsable spec")


@pytest.fixture(scope="module")
def shm_small(provisioned: Provisioned) -> Alone:
    return alone(provisioned, "/dev/shm too small")


@pytest.fixture(scope="module")
def nothing(provisioned: Provisioned) -> Alone:
    return alone(provisioned, "nothing enabled to serve")


# -- the matrix: one named result per fault and question --------------------------------------

FAULTS = (
    "unparsable spec",
    "persistent copy missing",
    "staged copy truncated",
    "staged copy changed at the same size",
    "engine killed three times in a row",
    "port taken",
    "server stopped by hand",
    "host boot unit disabled",
    "host boot unit failing",
    "/dev/shm too small",
    "nothing enabled to serve",
)
#: The boot-1 faults that hit one server: fault -> its server.
ON_SERVER = {
    "persistent copy missing": "fm-copy",
    "port taken": "fm-port",
    "staged copy truncated": "fm-trunc",
    "staged copy changed at the same size": "fm-same",
    "engine killed three times in a row": "fm-kill",
    "server stopped by hand": "fm-stop",
}
ALONE_FIXTURE = {
    "unparsable spec": "unparsable",
    "/dev/shm too small": "shm_small",
    "nothing enabled to serve": "nothing",
}


def state_line(kind: str, name: str, unit_: str, state: str) -> str:
    return f'ct200_boot_step_state{{kind="{kind}",name="{name}",unit="{unit_}",state="{state}"}} 1'


def this_boot(s: Said) -> None:
    """The textfile is this boot's: its id, never a previous boot's."""
    assert len(s.boot_id) == 36 and f'boot_id="{s.boot_id}"' in s.textfile, s.textfile


def status_line(s: Said, name: str) -> str:
    text = s.status[unit(name)]
    return next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("Status:")), "")


def truth_on_server(b: BootOne, fault: str) -> None:
    name = ON_SERVER[fault]
    ct = b.ct
    this_boot(ct)
    assert ct.chain_rc == 1 and not ct.chain["ok"], ct.chain_text
    step = ct.step("server", name)
    doctor_rc, doctor = ct.doctor[name]
    status = status_line(ct, name)
    if fault == "persistent copy missing":
        assert ct.step("stage", "tiny-b")["state"] == "failed", ct.chain
        assert (step["state"], step["failed_at"]) == ("failed", "preflight"), step
        assert "stopped at: stage tiny-b (ct200-stage@tiny-b.service): failed" in ct.chain_text
        assert ct.chain["stopped_at"]["name"] == "tiny-b"
        assert state_line("stage", "tiny-b", engine.stage_unit("tiny-b"), "failed") in ct.textfile
        assert doctor_rc == 2 and "[✗] models.staged" in doctor, doctor
        assert "tiny-b is missing and its persistent copy is missing" in doctor
        assert "preflight failed: model tiny-b: not staged" in status, status
    elif fault == "port taken":
        assert (step["state"], step["failed_at"]) == ("failed", "gate"), step
        assert state_line("server", name, unit(name), "failed") in ct.textfile
        assert doctor_rc == 2 and "[✗] server.port_free" in doctor, doctor
        assert f"(python3, unit {SQUATTER})" in doctor
        # The gate's verdict, not "preflight passed; starting" (fa27ee7).
        assert "gate fm-port: no-go: server.port_free" in status, status
    elif fault in ("staged copy truncated", "staged copy changed at the same size"):
        m = SERVERS[name][0]
        assert (step["state"], step["failed_at"]) == ("failed", "preflight"), step
        # At boot it served: the copy was damaged afterwards. The textfile says the boot's truth.
        assert state_line("server", name, unit(name), "ok") in ct.textfile
        assert doctor_rc == 2 and "[✗] models.staged" in doctor, doctor
        assert f"{m} is mismatch" in doctor, doctor
        if fault == "staged copy changed at the same size":
            # Same size: only the recorded change time tells, and the message says so.
            assert "changed since it was staged" in doctor and "content not trusted" in doctor
        assert f"preflight failed: model {m}: not staged" in status, status
        assert f"`ct200-stage stage {m} --spec /etc/ct200/site.yml --replace`" in status
    elif fault == "engine killed three times in a row":
        # Each start that served reset the start limit (378dd58): it is back after the third.
        assert step["state"] == "ok", step
        assert ct.units[unit(name)]["ActiveState"] == "active"
        assert b.completions[name] == 200, b.completions
        # During the first restart delay: restarting, said by systemd, the doctor and status.
        first = b.kills[0]
        assert (first["show"]["ActiveState"], first["show"]["SubState"]) == (
            "activating",
            "auto-restart",
        ), first["show"]
        assert "restarting after a failure (restart 1, last exit status 9)" in first["doctor"][1]
        assert 'Status: "not serving: the engine ended (signal: killed KILL)' in first["status"], (
            first["status"]
        )
        assert 'Status: "serving:' not in first["status"]
    elif fault == "server stopped by hand":
        assert step["state"] == "off", step
        assert step["detail"] == "inactive (dead), stopped after it ran at this boot", step
        assert doctor_rc == 2 and "is inactive (dead)" in doctor, doctor
        assert "$ systemctl start ct200-server-fm-stop.service" in doctor
        assert status.startswith('Status: "not serving: stopped'), status


def fixed_on_server(b: BootOne, fault: str) -> None:
    name = ON_SERVER[fault]
    at = {f"server {name}"} | ({"stage tiny-b"} if name == "fm-copy" else set())
    mine = [p for p in b.pasted if p.stopped_at in at]
    expected = {
        "persistent copy missing": "systemctl reset-failed ct200-stage@tiny-b.service && "
        "systemctl start ct200-stage@tiny-b.service",
        "port taken": f"systemctl stop {SQUATTER}",
        "staged copy truncated": "ct200-stage stage fm-c --spec /etc/ct200/site.yml --replace",
        "staged copy changed at the same size": "ct200-stage stage fm-d --spec "
        "/etc/ct200/site.yml --replace",
        "server stopped by hand": f"systemctl start {unit(name)}",
    }
    if fault == "engine killed three times in a row":
        assert not mine, mine  # nothing to repair: it came back by itself
    else:
        cmds = [p.command for p in mine]
        assert expected[fault] in cmds, [(p.stopped_at, p.command, p.rc) for p in b.pasted]
        assert all(p.rc == 0 for p in mine), [(p.command, p.rc, p.output) for p in mine]
    assert b.after.step("server", name)["state"] == "ok", b.after.chain_text
    assert b.completions_after[name] == 200, b.completions_after
    assert b.after.chain_rc == 0, b.after.chain_text


def recovered_on_server(two: BootTwo, fault: str) -> None:
    name = ON_SERVER[fault]
    assert two.recover.rc == 0, two.recover.describe()
    assert two.after.chain_rc == 0, two.after.chain_text
    assert two.completions_after[name] == 200, two.completions_after


def truth_host(request: pytest.FixtureRequest, fault: str) -> None:
    if fault == "host boot unit disabled":
        pve = request.getfixturevalue("boot_one").pve
        step = pve.step("host", "host-devices")
        assert (step["state"], step["detail"]) == ("off", "inactive (dead), disabled"), step
        want = "off"
        assert (
            "Loaded: loaded (/etc/systemd/system/ct200-host-devices.service; disabled"
            in (pve.status[DEVICES])
        ), pve.status[DEVICES]
    else:
        pve = request.getfixturevalue("boot_two").pve
        step = pve.step("host", "host-devices")
        assert step["state"] == "failed", step
        want = "failed"
        assert "cannot load nvidia" in pve.chain_text, pve.chain_text
        assert "Active: failed" in pve.status[DEVICES], pve.status[DEVICES]
    this_boot(pve)
    assert pve.chain_rc == 1 and pve.chain["stopped_at"]["unit"] == DEVICES, pve.chain
    assert (
        f'ct200_boot_chain_stopped{{kind="host",name="host-devices",unit="{DEVICES}",'
        f'state="{want}",failed_at=""}} 1'
    ) in pve.textfile, pve.textfile
    # The playbook alternative is whole, from the host's record (bf9faa5).
    assert (
        f"playbooks/recover.yml --limit {PVE},localhost --tags recover_host` on the controller"
        in (pve.chain_text)
    ), pve.chain_text


def fixed_host(request: pytest.FixtureRequest, fault: str) -> None:
    if fault == "host boot unit disabled":
        b = request.getfixturevalue("boot_one")
        pasted, after = b.host_pasted, b.after_pve
        assert [p.command for p in pasted] == [f"systemctl enable --now {DEVICES}"]
        assert after.chain_rc == 0, after.chain_text
    else:
        two = request.getfixturevalue("boot_two")
        pasted, after = two.host_pasted, two.pve_pasted
        assert [p.command for p in pasted] == [f"systemctl restart {DEVICES}"]
    assert all(p.rc == 0 for p in pasted), pasted
    assert after.step("host", "host-devices")["state"] == "ok", after.chain_text


def recovered_host(request: pytest.FixtureRequest, fault: str) -> None:
    two: BootTwo = request.getfixturevalue("boot_two")
    if fault == "host boot unit failing":
        # While the driver is missing, recover.yml stops there and says why.
        assert two.blocked.rc != 0, two.blocked.describe()
        assert any("host boot units" in r for r in two.blocked.results("failed"))
        assert DEVICES in two.blocked.output, two.blocked.output[-3000:]
    else:
        assert two.pve.step("host", "pcie-tune")["state"] == "off", two.pve.chain
    assert two.recover.rc == 0, two.recover.describe()
    assert two.after_pve.chain_rc == 0, two.after_pve.chain_text
    assert two.after_pve.units[TUNE]["UnitFileState"] == "enabled"


def truth_alone(a: Alone, fault: str) -> None:
    ct = a.ct
    this_boot(ct)
    if fault == "unparsable spec":
        assert ct.chain_rc == 2, ct.chain_text
        assert f"ct200-serve: {SPEC}: 1 problem(s) in the site spec" in ct.chain_text
        # The fix writes it again from the inventory, whole (4344d66).
        assert "then write it again with `cd " in ct.chain_text, ct.chain_text
        assert "ct200_boot_chain_ok 0" in ct.textfile
        assert 'ct200_boot_chain_reason{reason="spec unreadable: ' in ct.textfile, ct.textfile
        # A report that could not judge the chain fails visibly (the system is degraded).
        assert a.report_unit["Result"] == "exit-code", a.report_unit
        rc, doctor = ct.doctor["fm-kill"]
        assert rc == 2 and "playbooks/recover.yml" in doctor, doctor
        assert "Active: failed" in ct.status[unit("fm-kill")]
    elif fault == "/dev/shm too small":
        assert ct.chain_rc == 1, ct.chain_text
        assert ct.chain["stopped_at"]["kind"] == "stage", ct.chain
        first = ct.chain["stopped_at"]["name"]
        assert state_line("stage", first, engine.stage_unit(first), "failed") in ct.textfile
        rc, doctor = ct.doctor["fm-kill"]
        assert rc == 2 and "[✗] mem.shm" in doctor, doctor
        assert "preflight failed: model tiny-a: not staged" in status_line(ct, "fm-kill")
    else:
        assert ct.chain_rc == 5, ct.chain_text
        assert "boot chain: NOT SERVING: nothing to serve: the serving set is empty" in (
            ct.chain_text
        )
        assert "`ct200-serve switch fm-copy`" in ct.chain_text
        assert 'ct200_boot_chain_reason{reason="nothing to serve: ' in ct.textfile
        assert "ct200_boot_chain_ok 0" in ct.textfile
        assert a.report_unit["Result"] == "success", a.report_unit  # reported, not a failure
        for n in SERVERS:
            assert "Loaded: loaded" in ct.status[unit(n)] and "; disabled;" in ct.status[unit(n)]


def fixed_alone(a: Alone, fault: str) -> None:
    assert a.pasted, "nothing printed to paste"
    assert all(p.rc == 0 for p in a.pasted), [
        (p.where, p.command, p.rc, p.output) for p in a.pasted
    ]
    if fault == "unparsable spec":
        assert a.pasted[0].where == "controller" and "playbooks/recover.yml" in a.pasted[0].command
    if fault == "nothing enabled to serve":
        assert [p.command for p in a.pasted] == ["ct200-serve switch fm-copy"]
        assert a.completions_after_paste["fm-copy"] == 200
    else:
        assert a.completions_after_paste == dict.fromkeys(SERVERS, 200), a.completions_after_paste
    assert a.after_paste.chain_rc == 0, a.after_paste.chain_text


def recovered_alone(a: Alone, fault: str) -> None:
    if fault == "nothing enabled to serve":
        # recover.yml does not choose what a machine serves: it says so, with the command.
        assert a.recover.rc != 0
        assert "Nothing to serve" in a.recover.output and "ct200-serve switch NAME" in (
            a.recover.output
        )
        assert a.recover.stats[CT]["changed"] == 0, a.recover.describe()
        return
    assert a.recover.rc == 0, a.recover.describe()
    assert a.after_recover.chain_rc == 0, a.after_recover.chain_text
    assert a.completions_after == dict.fromkeys(SERVERS, 200), a.completions_after


@pytest.mark.parametrize("fault", FAULTS)
def test_the_tools_say_the_truth(fault: str, request: pytest.FixtureRequest) -> None:
    """`ct200-serve chain` (text; --json agrees), the textfile (this boot's id), the doctor and
    `systemctl status`."""
    if fault in ON_SERVER:
        b = request.getfixturevalue("boot_one")
        truth_on_server(b, fault)
        assert b.ct.chain.get("rc_differs") is None
    elif fault in ALONE_FIXTURE:
        truth_alone(request.getfixturevalue(ALONE_FIXTURE[fault]), fault)
    else:
        truth_host(request, fault)


@pytest.mark.parametrize("fault", FAULTS)
def test_the_printed_fix_pasted_repairs_it(fault: str, request: pytest.FixtureRequest) -> None:
    if fault in ON_SERVER:
        fixed_on_server(request.getfixturevalue("boot_one"), fault)
    elif fault in ALONE_FIXTURE:
        fixed_alone(request.getfixturevalue(ALONE_FIXTURE[fault]), fault)
    else:
        fixed_host(request, fault)


@pytest.mark.parametrize("fault", FAULTS)
def test_recover_repairs_it(fault: str, request: pytest.FixtureRequest) -> None:
    if fault in ON_SERVER:
        recovered_on_server(request.getfixturevalue("boot_two"), fault)
    elif fault in ALONE_FIXTURE:
        recovered_alone(request.getfixturevalue(ALONE_FIXTURE[fault]), fault)
    else:
        recovered_host(request, fault)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_second_recover_changes_nothing(fault: str, request: pytest.FixtureRequest) -> None:
    fixture = ALONE_FIXTURE.get(fault, "boot_two")
    run: AnsibleRun = request.getfixturevalue(fixture).again
    changed = {host: st["changed"] for host, st in run.stats.items() if st["changed"]}
    assert not changed, run.describe()
    if fault != "nothing enabled to serve":
        assert run.rc == 0, run.describe()


def test_testbed_ssh_runs_the_command_as_ssh_does(provisioned: Provisioned) -> None:
    """`python -m testbed ssh ct -- 'a; b'`: the remote shell parses the string (07c59ee)."""
    bed = provisioned.bed
    proc = subprocess.run(
        [
            str(VENV_BIN / "python"),
            "-m",
            "testbed",
            "ssh",
            "--slot",
            str(bed.slot.index),
            "ct",
            "--",
            "echo a; echo b",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert (proc.returncode, proc.stdout) == (0, "a\nb\n"), proc.stderr
