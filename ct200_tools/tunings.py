"""Every host tuning, once: one entry of data per tuning, from which the rest follows.

An entry says what the site spec accepts under `tuning:` (key, values, default), how the machine
shows the setting (a sysctl, or a sysfs file per CPU or device), how the PVE host applies it
(`apply`: "sysctl" persists a sysctl.d line and sets it now, "sysfs" persists a systemd-tmpfiles
`w` line and applies it now, "unit" is a boot unit of its own), the texts of its two checks
(`tune.<check>` on this machine, `host.<check>` on the host that `check --host` reads), the
cause link between them and the playbook tag. From this table come: the spec's reader and
defaults (spec/schema.py read_tuning, spec/model.py TuningSpec), the validated export
(ct200_validated.tunings, which roles/host_tuning applies), the kernel probe's sysfs reads
(facts kernel.tunings), the checks (doctor/checks/tune.py and host.py), their cause rules
(doctor/checks/causes.py) and so docs/checks.md. A tuning whose judgement needs code (MRRS:
each GPU's config space) registers a small judge beside the generic ones in checks/tune.py.

Standard library only, importing only ct200_tools.units (the units' names): the spec imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from ct200_tools.units import PCIE_TUNE

#: How the host applies a tuning: "sysctl" (sysctl.d file + sysctl -w), "sysfs" (a
#: systemd-tmpfiles `w` line, written at every boot by systemd-tmpfiles-setup.service, and
#: `systemd-tmpfiles --create` now), "unit" (a boot unit of its own, e.g. MRRS's setpci script).
Apply = Literal["sysctl", "sysfs", "unit"]
Value = int | str

#: The file roles/host_tuning persists sysctl tunings in (host_tuning_sysctl_file).
SYSCTL_FILE: Final = "/etc/sysctl.d/60-ct200.conf"
#: The file roles/host_tuning persists sysfs tunings in: one systemd-tmpfiles `w` line each.
TMPFILES_FILE: Final = "/etc/tmpfiles.d/60-ct200-tune.conf"

#: The PCIe Max Read Request Sizes a spec may ask for, in bytes; each one's index is its code in
#: bits 14:12 of the Device Control register (log2(bytes/128)). The one table: the schema's
#: choices, the doctor's fix (checks/tune.py) and the host's boot script (roles/host_tuning
#: renders it in from ct200_validated.mrrs) all read it.
MRRS_SIZES: Final = tuple(128 << code for code in range(6))


def mrrs_code(size: int) -> int:
    """The Device Control code of an MRRS size of MRRS_SIZES (ValueError for another)."""
    return MRRS_SIZES.index(size)


@dataclass(frozen=True)
class Sysfs:
    """One sysfs file per item (a CPU, a device): `<root>/<item>/<file>`, items matched by
    `item` (a regular expression over the names in root)."""

    root: str
    item: str
    file: str
    #: What one item is, in the checks' texts ("CPU").
    noun: str

    @property
    def glob(self) -> str:
        """The files as one shell/tmpfiles glob (the fix, the tmpfiles line)."""
        return f"{self.root}/{self.noun.lower()}*/{self.file}"


@dataclass(frozen=True)
class Tuning:
    #: The key under the spec's `tuning:` (tuning.<key>).
    key: str
    #: The checks' ids: tune.<check> and host.<check>.
    check: str
    #: The tune.* check's title; the host one's adds " on the host".
    title: str
    #: The values the spec accepts (ints: a range when contiguous).
    values: tuple[int, ...] | tuple[str, ...]
    #: The value when the key is absent; an explicit null always means "not managed".
    default: Value | None
    #: The spec's fix texts quote it.
    example: str
    apply: Apply
    #: The tune.* check's doc (docs/checks.md), then the host.* one's.
    doc: str
    host_doc: str
    #: Why tune.<check> fails because host.<check> does (checks/causes.py).
    cause: str
    #: For apply "sysfs": where the machine shows it.
    sysfs: Sysfs | None = None
    #: For apply "sysctl": its name (kernel.numa_balancing), read from /proc/sys.
    sysctl: str | None = None
    #: Its value's field of the facts' KernelFacts when it was recorded before this table
    #: (numa_balancing); else the probe reads it into KernelFacts.tunings.
    fact: str | None = None
    #: Why the value is wanted: the comment in the persisted file.
    why: str = ""
    #: The facts sections the tune.* check reads (the host.* one reads "host").
    needs: tuple[str, ...] = ("kernel",)
    gpu_only: bool = False
    tag: str = "host_tuning"


TUNINGS: Final = (
    Tuning(
        key="numa_balancing",
        check="numa_balancing",
        title="NUMA balancing",
        values=(0, 1),
        default=0,
        example="numa_balancing: 0",
        apply="sysctl",
        sysctl="kernel.numa_balancing",
        fact="numa_balancing",
        doc="kernel.numa_balancing equals tuning.numa_balancing (0: the workload is NUMA-pinned "
        "already). Host sysctl; read-only inside a container.",
        host_doc="tune.numa_balancing on the host, where the sysctl is set (/etc/sysctl.d by "
        "the host_tuning tag).",
        cause="the host's sysctl is wrong (check --host)",
        why="the inference servers are NUMA-bound already (one TP group per socket); automatic "
        "page migration only adds stalls",
    ),
    Tuning(
        key="pcie_max_read_request",
        check="pcie_mrrs",
        title="PCIe Max Read Request",
        values=MRRS_SIZES,
        default=None,
        example="pcie_max_read_request: 4096",
        apply="unit",
        doc="Each GPU's Device Control MRRS equals tuning.pcie_max_read_request. Config space "
        "resets at reboot and GPU reset, so a boot unit re-applies it. Skipped where only the "
        "64-byte header is readable (unprivileged container).",
        host_doc="tune.pcie_mrrs on the host, from each GPU's full config space (root there "
        "reads all 4096 bytes; a container sees only the 64-byte header). "
        f"{PCIE_TUNE.name()} re-applies it at every boot with a masked setpci write.",
        cause="the host's full config space shows the wrong MRRS (check --host)",
        needs=("pci", "kernel"),
        gpu_only=True,
    ),
    Tuning(
        key="cpu_governor",
        check="cpu_governor",
        title="CPU frequency governor",
        values=("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace"),
        default="performance",
        example="cpu_governor: performance",
        apply="sysfs",
        sysfs=Sysfs("/sys/devices/system/cpu", r"cpu\d+", "cpufreq/scaling_governor", "CPU"),
        doc="Every CPU's cpufreq scaling_governor equals tuning.cpu_governor (performance: a "
        "benchmark's figures must not depend on frequency scaling). Host sysfs, read-only in a "
        "container; a machine whose CPUs have no cpufreq (a VM) cannot be judged: a skip.",
        host_doc="tune.cpu_governor on the host, where a systemd-tmpfiles line "
        f"({TMPFILES_FILE}, the host_tuning tag) sets every CPU's governor at every boot.",
        cause="the host's CPU frequency governor is wrong (check --host)",
        why="a benchmark's figures must not depend on CPU frequency scaling",
    ),
)

BY_KEY: Final = {t.key: t for t in TUNINGS}


def export(values: dict[str, Value | None]) -> list[dict[str, object]]:
    """ct200_validated.tunings, what roles/host_tuning applies: each tuning with this spec's
    value (None: not managed), how it is applied, for sysfs where its files are (root, depth
    below it, glob) and its tmpfiles line, for sysctl its name and sysctl.d line."""
    out: list[dict[str, object]] = []
    for t in TUNINGS:
        value = values.get(t.key)
        entry: dict[str, object] = {"key": t.key, "value": value, "apply": t.apply, "why": t.why}
        if t.sysfs is not None:
            # The role finds the files with find(1) (no shell): root, depth and the glob.
            entry["root"] = t.sysfs.root
            entry["depth"] = 1 + t.sysfs.file.count("/") + 1
            entry["glob"] = t.sysfs.glob
            entry["line"] = None if value is None else tmpfiles_line(t, value)
        if t.sysctl is not None:
            entry["sysctl"] = t.sysctl
            entry["line"] = None if value is None else sysctl_line(t, value)
        out.append(entry)
    return out


def tmpfiles_line(t: Tuning, value: Value) -> str:
    """The systemd-tmpfiles line that writes a sysfs tuning at every boot (tmpfiles.d(5): `w`
    writes the argument to every file the glob matches)."""
    if t.sysfs is None:
        raise ValueError(f"tuning.{t.key} is not applied through sysfs")
    return f"w {t.sysfs.glob} - - - - {value}"


def sysctl_line(t: Tuning, value: Value) -> str:
    """The sysctl.d line that sets a sysctl tuning at every boot (sysctl.d(5))."""
    if t.sysctl is None:
        raise ValueError(f"tuning.{t.key} is not a sysctl")
    return f"{t.sysctl} = {value}"
