"""Every systemd unit the project installs, in one list: its name, the role that installs it, its
place in its machine's boot order and the spec field that turns it on.

The one source of these names: playbooks/validate.yml exports the list as
ct200_validated.units (and the host's chain as ct200_validated.host_chain) for the roles and
recover.yml; the boot chains (serve/chain.py, host/chain.py), the doctor's fixes and ct200-serve
name units through it (engines/paths.py for the per-server and per-model names). Docs and tests
may spell the names out: they check this list.

Standard library only: host/chain.py imports it on the PVE host, where ct200-tools is not
installed (roles/host_boot_report copies it there with the chain's other modules).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

Machine = Literal["host", "container"]
SUFFIX: Final = ".service"


@dataclass(frozen=True)
class Unit:
    #: The step's name: its label in the boot chain and its textfile, and its key in
    #: ct200_validated.units.
    step: str
    #: The unit's name without ".service"; for a unit per model or server, what comes before
    #: the instance's name (ct200-stage@ -> ct200-stage@<model>.service).
    prefix: str
    #: roles/<role> installs it.
    role: str
    machine: Machine
    #: Its place in its machine's start order (1 starts first).
    order: int
    #: The spec field that turns it on ("": always, with its role): set (not null) and not empty.
    field: str
    #: "": one unit; "model" or "server": one per model or server of the spec.
    per: str = ""
    #: A step of the machine's boot chain (read back by its chain); False: the report after it.
    chain: bool = True

    def name(self, instance: str = "") -> str:
        """The unit's name; for a unit per model or server, that instance's."""
        if bool(self.per) != bool(instance):
            raise ValueError(f"{self.step}: name({instance!r}) of a unit per {self.per or 'site'}")
        return f"{self.prefix}{instance}{SUFFIX}"

    def instance(self, unit: str) -> str | None:
        """The model or server a unit name belongs to (None: not one of this unit's)."""
        if self.per and unit.startswith(self.prefix) and unit.endswith(SUFFIX):
            return unit.removeprefix(self.prefix).removesuffix(SUFFIX) or None
        return None

    @property
    def shown(self) -> str:
        """The name as docs write it: ct200-server-<server>.service for one per server."""
        return self.name() if not self.per else f"{self.prefix}<{self.per}>{SUFFIX}"


# The PVE host: modules and nodes, then MRRS, before pve-guests.service starts the container;
# then the report of both.
HOST_DEVICES: Final = Unit("host-devices", "ct200-host-devices", "host_devices", "host", 1, "")
PCIE_TUNE: Final = Unit(
    "pcie-tune", "ct200-pcie-tune", "host_tuning", "host", 2, "tuning.pcie_max_read_request"
)
HOST_BOOT_REPORT: Final = Unit(
    "host-boot-report", "ct200-host-boot-report", "host_boot_report", "host", 3, "", chain=False
)
# The container: each model staged, then each server behind its gates, then the report.
STAGE: Final = Unit("stage", "ct200-stage@", "model_staging", "container", 1, "models", "model")
SERVER: Final = Unit(
    "server", "ct200-server-", "inference_servers", "container", 2, "servers", "server"
)
BOOT_REPORT: Final = Unit(
    "boot-report", "ct200-boot-report", "boot_report", "container", 3, "", chain=False
)

#: Every unit, each machine's in start order.
UNITS: Final = (HOST_DEVICES, PCIE_TUNE, HOST_BOOT_REPORT, STAGE, SERVER, BOOT_REPORT)


def by_step(step: str) -> Unit:
    found = next((u for u in UNITS if u.step == step), None)
    if found is None:
        raise KeyError(f"no unit {step!r}; the units are {', '.join(u.step for u in UNITS)}")
    return found


def turned_on(unit: Unit, site: object) -> bool:
    """Whether the site spec (a SiteSpec, or any object with its attributes) turns the unit on:
    its field is set and, for a list, not empty."""
    value: object = site
    for part in unit.field.split(".") if unit.field else ():
        value = getattr(value, part, None)
    if isinstance(value, Iterable) and not isinstance(value, str):
        return any(True for _ in value)
    return value is not None


def host_chain(site: object) -> list[dict[str, str]]:
    """The host's boot chain for this spec, in start order: {name, unit} per step (the steps
    ct200-host-chain reads back; a unit the spec turns off is not installed, so not a step)."""
    return [
        {"name": u.step, "unit": u.name()}
        for u in sorted(UNITS, key=lambda u: u.order)
        if u.machine == "host" and u.chain and turned_on(u, site)
    ]


def export(site: object) -> dict[str, dict[str, object]]:
    """The list for Ansible (ct200_validated.units), keyed by step: every unit with its name
    (unit; for one per model or server, prefix + name + suffix), role, order, field and
    whether this spec turns it on."""
    return {
        u.step: {
            "unit": u.shown,
            "prefix": u.prefix,
            "suffix": SUFFIX,
            "per": u.per,
            "role": u.role,
            "machine": u.machine,
            "order": u.order,
            "field": u.field,
            "chain": u.chain,
            "enabled": turned_on(u, site),
        }
        for u in UNITS
    }
