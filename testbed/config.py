"""Where the testbed keeps things, what it builds, and how a slot names its machines.

A *slot* is one independent testbed: its own bridge, subnet, namespaces and machines, so that a
test run (slots 1..) and a testbed brought up by hand (slot 0) can live side by side.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError

#: The checkout this package runs from (the testbed is a developer tool that never ships).
REPO_ROOT = Path(__file__).resolve().parents[1]

SUITE = "bookworm"
#: bookworm's python3; the wheelhouse for the machines is downloaded for this version.
TARGET_PYTHON = "3.11"
#: glibc of bookworm: the newest manylinux tag its machines accept.
TARGET_GLIBC = (2, 36)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: What a machine needs to be managed like the real ones: systemd as PID 1, sshd, python3 for
#: Ansible (with python3-apt and python3-packaging, which the builtin apt and pip modules import
#: on the target), python3-venv for the tools' venv, iproute2 for `ss`/`ip` in verification.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-packaging",
    "python3-venv",
    "sudo",
    "iproute2",
    "procps",
)
#: Bump when the rootfs recipe changes in a way the package list does not show.
RECIPE_VERSION = 1

ROLES = ("pve", "ct", "plain")
DEFAULT_MACHINES = ("pve:pve", "ct:ct")
MAX_SLOTS = 16
#: Slot 0 is the one brought up by hand (and the README's quickstart); tests take 1.. .
TEST_SLOTS = range(1, 9)
SSH_PORT = 22
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    run_dir: Path
    repo: Path
    mirror: str
    net_base: ipaddress.IPv4Address

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        base_text = env.get("CT200_TESTBED_NET", "10.231.0.0")
        try:
            base = ipaddress.IPv4Address(base_text)
        except ValueError as exc:
            raise TestbedError(
                f"CT200_TESTBED_NET={base_text!r} is not an IPv4 address",
                fix="set it to the first address of a free private /16-ish range, e.g. 10.231.0.0",
            ) from exc
        if not base.is_private or int(base) % 256:
            raise TestbedError(
                f"CT200_TESTBED_NET={base_text} must be a private address ending in .0",
                fix="use a range in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, e.g. 10.231.0.0",
            )
        return cls(
            cache_dir=Path(env.get("CT200_TESTBED_CACHE", "/var/cache/ct200-testbed")),
            run_dir=Path(env.get("CT200_TESTBED_RUN", "/run/ct200-testbed")),
            repo=Path(env.get("CT200_TESTBED_REPO", str(REPO_ROOT))),
            mirror=env.get("CT200_TESTBED_MIRROR", DEFAULT_MIRROR).rstrip("/"),
            net_base=base,
        )


@dataclass(frozen=True)
class MachineSpec:
    name: str
    role: str

    @classmethod
    def parse(cls, text: str) -> MachineSpec:
        """``NAME`` or ``NAME:ROLE``; a bare name is its own role when it names one."""
        name, _, role = text.partition(":")
        role = role or (name if name in ROLES else "plain")
        if not _NAME_RE.match(name):
            raise TestbedError(
                f"machine name {name!r} is not usable",
                fix="use 1-8 characters, lower-case letters and digits, starting with a letter",
            )
        if role not in ROLES:
            raise TestbedError(
                f"machine {name}: unknown role {role!r}", fix=f"use one of {', '.join(ROLES)}"
            )
        return cls(name, role)


@dataclass(frozen=True)
class Slot:
    index: int
    settings: Settings

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_SLOTS:
            raise TestbedError(
                f"slot {self.index} is out of range", fix=f"use a slot from 0 to {MAX_SLOTS - 1}"
            )

    @property
    def prefix(self) -> str:
        return f"ct200tb{self.index}"

    @property
    def bridge(self) -> str:
        return self.prefix

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        first = ipaddress.IPv4Address(int(self.settings.net_base) + 256 * self.index)
        return ipaddress.IPv4Network(f"{first}/24")

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The controller's address on the testbed bridge."""
        return self.subnet[1]

    def address(self, position: int) -> ipaddress.IPv4Address:
        return self.subnet[10 + position]

    def netns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def veth(self, name: str) -> str:
        return f"tb{self.index}-{name}"

    @property
    def dir(self) -> Path:
        return self.settings.run_dir / f"slot-{self.index}"

    def machine_dir(self, name: str) -> Path:
        return self.dir / "machines" / name

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.ssh_dir / "config"

    @property
    def control_dir(self) -> Path:
        """Ansible's ControlPersist sockets for this slot (closed on down)."""
        return self.dir / "cp"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.settings.run_dir / f"slot-{self.index}.lock"

    @property
    def inventory_dir(self) -> Path:
        if self.index == 0:
            return self.settings.repo / "inventory" / "testbed"
        return self.dir / "inventory"

    @property
    def inventory(self) -> Path:
        return self.inventory_dir / "hosts.yml"

    @property
    def cgroup_rel(self) -> str:
        return f"ct200-testbed/slot-{self.index}"
