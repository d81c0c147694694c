"""Bring a testbed slot up, tear it down, and say what state it is in.

Teardown finds what to remove by name and by cgroup (not only from the state file), so it also
clears what a killed run left behind, and ``up`` runs it first whenever it finds such leftovers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from testbed import cgroups, inventory, machine, network, rootfs, ssh, standins, wheelhouse
from testbed.config import TEST_SLOTS, MachineSpec, Settings, Slot
from testbed.errors import TestbedError
from testbed.machine import Machine
from testbed.system import BUILD_TOOLS, TOOLS, Runner, install_hint, missing_tools, preflight

PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")
DEFAULT_VMID = 200


@dataclass(frozen=True)
class MachineStatus:
    name: str
    role: str
    address: str
    running: bool
    ssh: bool | None


@dataclass(frozen=True)
class Status:
    slot: int
    #: "up" (every machine running), "down" (nothing there) or "leftover" (anything else).
    state: str
    machines: tuple[MachineStatus, ...] = ()
    leftovers: tuple[str, ...] = ()
    inventory: str | None = None


@dataclass
class RebootReport:
    """What a power cycle did: per machine, when it was powered on (controller wall clock, epoch
    seconds) and when it answered SSH with systemd done booting; machines left powered off (the
    container when the pve-guests stand-in did not start it) with why."""

    powered_on: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    system_state: dict[str, str] = field(default_factory=dict)
    left_off: dict[str, str] = field(default_factory=dict)


@dataclass
class UpReport:
    machines: list[Machine]
    inventory: Path
    reused: bool = False
    timings: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def slot_lock(slot: Slot, wait: bool = True) -> Iterator[IO[str]]:
    """Hold the slot for this process; other runs wait (``wait``) or get a TestbedError."""
    slot.settings.run_dir.mkdir(parents=True, exist_ok=True)
    with slot.lock_file.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            if not wait:
                raise TestbedError(
                    f"testbed slot {slot.index} is in use by {holder}",
                    fix="wait for it to finish, or use another slot (--slot)",
                ) from None
            print(f"testbed: slot {slot.index} is in use by {holder}; waiting", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        yield fh


def claim_test_slot(settings: Settings, stack: contextlib.ExitStack) -> Slot | None:
    """Lock the first free test slot for as long as `stack` lives; None when all are taken."""
    for n in TEST_SLOTS:
        candidate = Slot(n, settings)
        try:
            stack.enter_context(slot_lock(candidate, wait=False))
        except TestbedError:
            continue
        return candidate
    return None


def unmet(settings: Settings, ansible_bin: Path) -> str | None:
    """Why a testbed cannot run here, with Ansible from ``ansible_bin`` against it, or None."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, mounts, systemd-nspawn)"
    tools = dict(TOOLS)
    if not rootfs.is_built(settings):
        tools.update(BUILD_TOOLS)
    missing = missing_tools(tools)
    if missing:
        return f"missing {', '.join(sorted(missing))}: {install_hint(missing)}"
    if not (ansible_bin / "ansible-playbook").exists():
        return f"ansible-playbook is not installed in {ansible_bin}: run `bash scripts/setup.sh`"
    return None


def site_vmid(settings: Settings) -> int:
    """The container's vmid from the testbed's site spec (the stand-in config is named by it)."""
    path = settings.repo / "inventory" / "testbed" / "group_vars" / "all.yml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return int(data["ct200_site"]["pve"]["vmid"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return DEFAULT_VMID


class Harness:
    def __init__(self, slot: Slot, runner: Runner | None = None) -> None:
        self.slot = slot
        self.settings = slot.settings
        self.runner = runner or Runner()

    # -- state -------------------------------------------------------------------------------
    def machines(self) -> list[Machine]:
        try:
            data = json.loads(self.slot.state_file.read_text())
        except (OSError, ValueError):
            return []
        return [Machine.from_json(m) for m in data.get("machines", [])]

    def _stage(self) -> str:
        try:
            return str(json.loads(self.slot.state_file.read_text()).get("stage", ""))
        except (OSError, ValueError):
            return ""

    def _save(self, machines: Sequence[Machine], stage: str) -> None:
        data = {
            "slot": self.slot.index,
            "stage": stage,
            "time": time.time(),
            "machines": [m.to_json() for m in machines],
        }
        tmp = self.slot.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.slot.state_file)

    def leftovers(self) -> list[str]:
        """Everything of this slot that exists on the controller now."""
        slot, found = self.slot, []
        if slot.state_file.exists():
            found.append(f"state {slot.state_file}")
        found += [f"netns {ns}" for ns in network.namespaces(slot.prefix + "-")]
        if network.link_exists(self.runner, slot.bridge):
            found.append(f"bridge {slot.bridge}")
        mounts = Path("/proc/self/mountinfo").read_text()
        found += [
            f"mount {m}"
            for m in sorted(
                {
                    line.split()[4]
                    for line in mounts.splitlines()
                    if line.split()[4].startswith(str(slot.dir) + "/")
                }
            )
        ]
        pids = cgroups.procs(cgroups.slot_dirs(cgroups.hierarchies(), slot.cgroup_rel))
        if pids:
            found.append(f"{len(pids)} processes in cgroup {slot.cgroup_rel}")
        return found

    def status(self, probe_ssh: bool = True) -> Status:
        left = self.leftovers()
        if not left:
            return Status(self.slot.index, "down")
        rows = []
        for m in self.machines():
            running = machine.alive(m.pid, self.slot.netns(m.name))
            reach: bool | None = None
            if probe_ssh and running:
                proc = self.runner.run(
                    ssh.argv(self.slot, m.address, ["true"]), check=False, timeout=15
                )
                reach = proc.returncode == 0
            rows.append(MachineStatus(m.name, m.role, m.address, running, reach))
        healthy = (
            self._stage() == "up"
            and bool(rows)
            and all(r.running and r.ssh is not False for r in rows)
        )
        inv = str(self.slot.inventory) if self.slot.inventory.exists() else None
        return Status(
            self.slot.index, "up" if healthy else "leftover", tuple(rows), tuple(left), inv
        )

    # -- up ----------------------------------------------------------------------------------
    def up(
        self,
        specs: Sequence[MachineSpec],
        fresh: bool = False,
        with_wheelhouse: bool = True,
        rebuild: bool = False,
    ) -> UpReport:
        preflight()
        started = time.monotonic()
        timings: dict[str, float] = {}
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise TestbedError(
                f"machine names repeat: {names}", fix="give every machine its own name"
            )
        if self.leftovers():
            st = self.status()
            same = [(m.name, m.role) for m in st.machines] == [(s.name, s.role) for s in specs]
            if st.state == "up" and same and not fresh:
                wh = self._wheelhouse(timings) if with_wheelhouse else None
                inv = inventory.write(self.slot, self.machines(), wh)
                timings["total"] = time.monotonic() - started
                return UpReport(self.machines(), inv, reused=True, timings=timings)
            if st.state == "up":
                why = "--fresh" if fresh else "other machines asked for"
                print(f"testbed: slot {self.slot.index}: replacing the running testbed ({why})")
                self.down(quiet=True)
            else:
                print(
                    f"testbed: slot {self.slot.index}: found a testbed left over from a run that "
                    "did not finish (killed or crashed); removing it first: "
                    + ", ".join(st.leftovers),
                    flush=True,
                )
                self.down()
        network.check_free(self.runner, self.slot)
        lower, timings["rootfs_build"] = rootfs.ensure(self.settings, self.runner, rebuild)
        wh = self._wheelhouse(timings) if with_wheelhouse else None
        boot_started = time.monotonic()
        try:
            machines = self._boot(specs, lower)
        except BaseException:
            self._keep_logs(specs)
            with contextlib.suppress(Exception):
                self.down(quiet=True)
            raise
        timings["boot"] = time.monotonic() - boot_started
        inv = inventory.write(self.slot, machines, wh)
        timings["total"] = time.monotonic() - started
        return UpReport(machines, inv, timings=timings)

    def _wheelhouse(self, timings: dict[str, float]) -> Path:
        wh, timings["wheelhouse"] = wheelhouse.build(self.settings, self.runner)
        return wh

    def _boot(self, specs: Sequence[MachineSpec], lower: Path) -> list[Machine]:
        slot = self.slot
        for d in (slot.dir, slot.ssh_dir, slot.control_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._save([], "booting")
        controller_pub = ssh.keygen(self.runner, slot.key, f"ct200-testbed-slot{slot.index}")
        found = cgroups.hierarchies()
        env = cgroups.nspawn_env(found)
        network.create_bridge(self.runner, slot)
        hosts = {s.name: str(slot.address(i)) for i, s in enumerate(specs)}
        vmid = site_vmid(self.settings)
        prepared: list[tuple[MachineSpec, Path, str]] = []
        hostkeys: dict[str, str] = {}
        for i, spec in enumerate(specs):
            address = hosts[spec.name]
            netns_path = network.create_machine(self.runner, slot, spec.name, slot.address(i))
            root = machine.mount_root(self.runner, slot, spec.name, lower)
            hostkeys[address] = machine.personalize(
                self.runner, root, spec, hosts, controller_pub, vmid
            )
            prepared.append((spec, root, netns_path))
        ssh.write_known_hosts(slot, hostkeys)
        ssh.write_config(slot, hosts)
        machines: list[Machine] = []
        for spec, root, netns_path in prepared:
            dirs = cgroups.machine_dirs(found, slot.cgroup_rel, spec.name)
            pid, log = machine.boot(slot, spec, root, netns_path, dirs, env)
            machines.append(
                Machine(
                    spec.name,
                    spec.role,
                    hosts[spec.name],
                    pid,
                    netns_path,
                    str(root),
                    str(log),
                    machine.nspawn_lock(root),
                )
            )
            self._save(machines, "booting")
        for m in machines:
            alive = functools.partial(machine.alive, m.pid, slot.netns(m.name))
            ssh.wait_ready(self.runner, slot, m.name, m.address, alive, Path(m.log))
        self._save(machines, "up")
        return machines

    # -- reboot ------------------------------------------------------------------------------
    def reboot(self, names: Sequence[str] = (), timeout: float = 600) -> RebootReport:
        """Power-cycle machines of the slot (default: all): each is powered off (nspawn asks its
        systemd to shut down) and booted again from the same root, so systemd boots anew and
        the tmpfs mounts (/dev/shm, /run) start empty, as after a host reboot.

        With the ``pve`` machine in the cycle it boots first; its pve-guests.service stand-in
        then says which containers PVE would start (``onboot: 1``), and a ``ct`` machine is
        powered on only when its vmid is among them (else it stays off: ``left_off``). A ``ct``
        machine cycled without ``pve`` is a container restart (``pct reboot``): it boots.
        Returns once every booted machine answers SSH and systemd finished booting (a
        "degraded" system counts as booted: a failed unit is what a test may look for)."""
        current = {m.name: m for m in self.machines()}
        if not current:
            raise TestbedError(
                f"slot {self.slot.index} has no machines", fix="`python -m testbed up` first"
            )
        unknown = [n for n in names if n not in current]
        if unknown:
            raise TestbedError(
                f"no machine {', '.join(unknown)} in slot {self.slot.index} "
                f"(there are: {', '.join(current)})",
                fix="name machines of this slot, or none for all",
            )
        chosen = [current[n] for n in (names or list(current))]
        # pve first: its pve-guests stand-in decides whether the container starts.
        chosen.sort(key=lambda m: 0 if m.role == "pve" else 1 if m.role == "ct" else 2)
        self._close_masters()
        for m in reversed(chosen):
            if not machine.stop(m.pid, self.slot.netns(m.name), timeout=60):
                raise TestbedError(
                    f"machine {m.name} did not power off within 60 s",
                    fix=f"`python -m testbed down --slot {self.slot.index}`, then up",
                )
            if m.lock and Path(m.lock).parent == machine.NSPAWN_LOCKS:
                Path(m.lock).unlink(missing_ok=True)
        report = RebootReport()
        found = cgroups.hierarchies()
        env = cgroups.nspawn_env(found)
        pve_cycled = any(m.role == "pve" for m in chosen)
        for m in chosen:
            if m.role == "ct" and pve_cycled:
                why = self._not_started_by_pve(current, report)
                if why:
                    report.left_off[m.name] = why
                    continue
            spec = MachineSpec(m.name, m.role)
            dirs = cgroups.machine_dirs(found, self.slot.cgroup_rel, m.name)
            report.powered_on[m.name] = time.time()
            pid, log = machine.boot(self.slot, spec, Path(m.root), m.netns, dirs, env)
            current[m.name] = dataclasses.replace(
                m, pid=pid, log=str(log), lock=machine.nspawn_lock(Path(m.root))
            )
            self._save(list(current.values()), "up")
            alive = functools.partial(machine.alive, pid, self.slot.netns(m.name))
            report.system_state[m.name] = ssh.wait_booted(
                self.runner, self.slot, m.name, m.address, alive, log, timeout=timeout
            )
            report.ready[m.name] = time.time()
        return report

    def _not_started_by_pve(self, current: dict[str, Machine], report: RebootReport) -> str:
        """Why the pve-guests stand-in did not start the container, or "" when it did."""
        pve = next((m for m in current.values() if m.role == "pve"), None)
        if pve is None or pve.name not in report.ready:
            return "its PVE machine is not up"
        vmid = site_vmid(self.settings)
        proc = self.runner.run(
            ssh.argv(self.slot, pve.address, ["cat", standins.PVE_GUESTS_STATE]),
            check=False,
            timeout=30,
        )
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            return f"pve-guests (stand-in) left no {standins.PVE_GUESTS_STATE}"
        if vmid in data.get("started", []):
            return ""
        why = data.get("skipped", {}).get(str(vmid), "not configured")
        return f"pve-guests (stand-in) did not start CT {vmid}: {why}"

    def _close_masters(self) -> None:
        """End Ansible's ControlPersist masters: they would talk to a machine that is gone."""
        slot = self.slot
        for sock in sorted(slot.control_dir.glob("*")) if slot.control_dir.is_dir() else []:
            self.runner.run(
                ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "testbed"],
                check=False,
                timeout=10,
            )

    def _keep_logs(self, specs: Sequence[MachineSpec]) -> None:
        for spec in specs:
            log = self.slot.machine_dir(spec.name) / "console.log"
            if log.exists():
                keep = self.settings.run_dir / f"slot-{self.slot.index}-{spec.name}-failed.log"
                shutil.copyfile(log, keep)
                print(f"testbed: console log of {spec.name} kept in {keep}", flush=True)

    # -- files -------------------------------------------------------------------------------
    def push(self, name: str, src: Path, dest: str, mode: int = 0o644) -> Path:
        """Copy a file from the controller into machine `name` at `dest`, through its root on
        the controller (no SSH; what a test needs there before a playbook runs, such as the
        llama-server build). Written beside the target and renamed: never half a file."""
        found = next((m for m in self.machines() if m.name == name), None)
        if found is None or not dest.startswith("/"):
            raise TestbedError(
                f"cannot push to {name}:{dest}",
                fix="name a machine of this slot and an absolute path in it",
            )
        target = Path(found.root) / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.push")
        shutil.copyfile(src, tmp)
        tmp.chmod(mode)
        tmp.replace(target)
        return target

    # -- down --------------------------------------------------------------------------------
    def down(self, quiet: bool = False) -> list[str]:
        """Remove everything of the slot; safe to run any number of times."""
        slot, removed = self.slot, []
        self._close_masters()
        running = [m for m in self.machines() if machine.alive(m.pid, slot.netns(m.name))]
        for m in running:
            os.kill(m.pid, signal.SIGTERM)  # nspawn asks the machine's systemd to power off
        for m in running:
            clean = machine.stop(m.pid, slot.netns(m.name), timeout=10)
            removed.append(f"machine {m.name} ({'powered off' if clean else 'killed'})")
        dirs = cgroups.slot_dirs(cgroups.hierarchies(), slot.cgroup_rel)
        killed = cgroups.kill(dirs)
        if killed:
            removed.append(f"{killed} processes killed")
        for m in self.machines():
            if m.lock and Path(m.lock).parent == machine.NSPAWN_LOCKS and Path(m.lock).exists():
                Path(m.lock).unlink()
                removed.append(f"nspawn lock {m.lock}")
        removed += [f"mount {m}" for m in machine.unmount_under(self.runner, slot.dir)]
        removed += network.delete(self.runner, slot)
        cgroups.remove(dirs)
        for parent in {d.parent for d in dirs}:
            with contextlib.suppress(OSError):
                parent.rmdir()  # ct200-testbed/, once no slot uses it
        for leftover in PROPAGATE_DIR.glob(slot.prefix + "-*") if PROPAGATE_DIR.is_dir() else []:
            shutil.rmtree(leftover, ignore_errors=True)
        still = machine.unmount_under(self.runner, slot.dir)
        if still:
            raise TestbedError(
                f"cannot unmount {', '.join(still)}",
                fix="find what uses it (`fuser -vm PATH`), end it, then run down again",
            )
        if inventory.remove(slot):
            removed.append(f"inventory {slot.inventory}")
        if slot.dir.exists():
            shutil.rmtree(slot.dir)
            removed.append(f"state {slot.dir}")
        if not quiet:
            what = "; ".join(removed) if removed else "nothing was there"
            print(f"testbed: slot {slot.index} down: {what}", flush=True)
        return removed
