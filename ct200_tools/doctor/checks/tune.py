"""tune.*: the host tunings that must hold before benchmarks, one check per entry of
ct200_tools.tunings (tune.<check>, and host.<check> in checks/host.py), made here from the entry.

A sysctl or sysfs tuning is judged by its kind's one judgement (the kernel's value, or every
item's, is the spec's); a tuning whose judgement needs code registers it in JUDGES beside its
function: MRRS (each GPU's config space, set by a boot unit of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ct200_tools.doctor.checks.base import (
    Check,
    Context,
    FactName,
    Outcome,
    Remedy,
    Where,
    check,
    failed,
    passed,
    plural,
    skipped,
)
from ct200_tools.facts import HostFacts, KernelFacts, PciFacts
from ct200_tools.tunings import (
    SYSCTL_FILE,
    TMPFILES_FILE,
    TUNINGS,
    Tuning,
    mrrs_code,
    sysctl_line,
    tmpfiles_line,
)
from ct200_tools.units import PCIE_TUNE

#: A tuning's judgement: (ctx, the tuning, its side's facts, why unreadable, where the fix goes).
Judge = Callable[[Context, Tuning, "Seen", Where], Outcome]
#: How many wrong items a failure lists.
MAX_LISTED = 8


@dataclass(frozen=True)
class Seen:
    """One side's facts for a tuning (this machine's for tune.*, the host's for host.*): its
    kernel and PCI facts, and why what the tuning reads was not read."""

    kernel: KernelFacts | None
    pci: tuple[PciFacts, ...] | None
    why: str | None


def here(ctx: Context, t: Tuning) -> Seen:
    keys = ("pci",) if t.apply == "unit" else (f"kernel.{t.key}", f"kernel.tuning.{t.key}")
    return Seen(ctx.facts.kernel, ctx.facts.pci, ctx.unreadable(*keys))


def on_host(ctx: Context, t: Tuning, h: HostFacts) -> Seen:
    keys = (
        ("host.pci",)
        if t.apply == "unit"
        else (
            f"host.kernel.{t.key}",
            f"host.kernel.tuning.{t.key}",
        )
    )
    return Seen(h.kernel, h.pci, ctx.unreadable(*keys))


def judge_sysctl(ctx: Context, t: Tuning, seen: Seen, where: Where) -> Outcome:
    """A sysctl tuning: the kernel's value is the spec's. The host's sysctl, read only in a
    container: the fix is the host's (sysctl -w now, a sysctl.d line for every boot)."""
    want = ctx.site.tuning.value(t.key)
    if want is None:
        return skipped(f"tuning.{t.key} not managed by the spec")
    name = t.sysctl or t.key
    k = seen.kernel
    have: object = None
    if k is not None:
        have = getattr(k, t.fact) if t.fact else (k.tunings.get(t.key) or {}).get(name)
    if have is None:
        return skipped(f"{name} not readable", seen.why or "")
    if str(have) == str(want):
        return passed(f"{name} = {have}")
    return failed(
        f"{name} = {have}, the spec wants {want}",
        Remedy(
            "set the host sysctl now and persist it for every boot (a container cannot change it)",
            where,
            f"sysctl -w {name}={want}",
            t.tag,
            (sysctl_line(t, want),),
            SYSCTL_FILE,
        ),
    )


def judge_mrrs(
    ctx: Context, pci: tuple[PciFacts, ...] | None, why_unreadable: str | None, where: Where
) -> Outcome:
    """tune.pcie_mrrs's judgement, on this machine's config space or the host's (host.*)."""
    want = ctx.site.tuning.value("pcie_max_read_request")
    if not isinstance(want, int):
        return skipped("tuning.pcie_max_read_request not managed by the spec")
    if pci is None:
        return skipped("PCI facts not read", why_unreadable or "")
    if not pci:
        return skipped("no NVIDIA GPU on the PCI bus")
    unreadable = [p.bdf for p in pci if p.max_read_request is None]
    if len(unreadable) == len(pci):
        return skipped(
            "MRRS cannot be read here: config space beyond the header needs root on the host "
            "(run ct200-doctor check on the host, or check --host HOST)",
            why_unreadable or "",
        )
    wrong = [p for p in pci if p.max_read_request is not None and p.max_read_request != want]
    evidence = [f"{p.bdf}: MRRS {p.max_read_request} MPS {p.max_payload}" for p in pci]
    if not wrong:
        return passed(f"MRRS {want} on every readable GPU", *evidence)
    code = mrrs_code(want)
    return failed(
        f"MRRS is not {want} on {plural(len(wrong), 'GPU')} "
        "(config space resets at reboot and GPU reset)",
        Remedy(
            f"re-apply with a masked write at boot ({PCIE_TUNE.name()} does this)",
            where,
            "\n".join(f"setpci -s {p.bdf} CAP_EXP+8.w={code}000:7000" for p in wrong),
            "host_tuning",
        ),
        *evidence,
    )


def judge_sysfs(ctx: Context, t: Tuning, seen: Seen, where: Where) -> Outcome:
    """A sysfs tuning: every item (CPU, device) shows the spec's value. No file here (a CPU
    without cpufreq: a VM) cannot be judged: a skip that says so, never a failure."""
    want = ctx.site.tuning.value(t.key)
    if want is None:
        return skipped(f"tuning.{t.key} not managed by the spec")
    if t.sysfs is None:  # the table's test pairs apply "sysfs" with a path
        raise ValueError(f"tuning.{t.key}: apply sysfs without a sysfs path")
    noun = t.sysfs.noun
    got = (seen.kernel.tunings if seen.kernel else {}).get(t.key)
    if not got:
        return skipped(
            f"{t.sysfs.file} cannot be read here: no {noun} has {t.sysfs.glob} "
            f"(no {t.sysfs.file.split('/')[0]} driver, e.g. a VM)",
            seen.why or "",
        )
    wrong = {item: v for item, v in got.items() if v != str(want)}
    leaf = t.sysfs.file.rsplit("/", 1)[-1]
    if not wrong:
        return passed(f"{leaf} = {want} on every {noun} ({plural(len(got), noun)})")
    listed = [f"{item}: {v}" for item, v in list(wrong.items())[:MAX_LISTED]]
    if len(wrong) > MAX_LISTED:
        listed.append(f"and {len(wrong) - MAX_LISTED} more")
    return failed(
        f"{leaf} is not {want} on {len(wrong)} of {plural(len(got), noun)}",
        Remedy(
            "set it now and at every boot with a systemd-tmpfiles line (a container cannot "
            "write the host's sysfs)",
            where,
            f"systemd-tmpfiles --create {TMPFILES_FILE}",
            t.tag,
            (tmpfiles_line(t, want),),
            TMPFILES_FILE,
        ),
        *listed,
    )


def _mrrs(ctx: Context, t: Tuning, seen: Seen, where: Where) -> Outcome:
    return judge_mrrs(ctx, seen.pci, seen.why, where)


#: The tunings whose judgement needs code, by key; the others' is their apply kind's.
JUDGES: dict[str, Judge] = {"pcie_max_read_request": _mrrs}
BY_APPLY: dict[str, Judge] = {"sysfs": judge_sysfs, "sysctl": judge_sysctl}


def judge(ctx: Context, t: Tuning, seen: Seen, where: Where) -> Outcome:
    return (JUDGES.get(t.key) or BY_APPLY[t.apply])(ctx, t, seen, where)


def made(
    t: Tuning,
    prefix: str,
    title: str,
    doc: str,
    needs: tuple[str, ...],
    module: str,
    fn: Callable[[Context], Outcome],
) -> Check:
    """A tuning's check unit, as @check makes one, shown as its prefix module's."""
    fn.__doc__, fn.__module__, fn.__name__ = doc, module, f"check_{prefix}_{t.check}"
    return check(
        f"{prefix}.{t.check}",
        title,
        "error",
        needs=cast(tuple[FactName, ...], needs),
        needs_spec=True,
        tags=(t.tag,),
        gpu_only=t.gpu_only,
    )(fn)


def tune_check(t: Tuning) -> Check:
    return made(
        t,
        "tune",
        t.title,
        t.doc,
        t.needs,
        __name__,
        lambda ctx: judge(ctx, t, here(ctx, t), ctx.host_where),
    )


#: tune.<check> of every tuning, in the table's order.
CHECKS: tuple[Check, ...] = tuple(tune_check(t) for t in TUNINGS)
