"""lxc.*: the container's config on the PVE host (/etc/pve/lxc/<vmid>.conf), as `check --host`
reads it, against the host's current majors (its /proc/devices).

The config is read with the parser the ct200_pve_lxc_gpu module edits it with
(ct200_tools/host/pvecfg.py); the lxc_passthrough tag applies the fixes under pve-container's config
lock (a stale major's rule is replaced where it stands, as the fix shows).

The incident: raw-lxc lines allowed nvidia-uvm's major of an older boot (509); after a driver
update the host gave it another (511), the container's open() got EPERM and cuInit 999.
"""

from __future__ import annotations

from ct200_tools.doctor.checks import dev
from ct200_tools.doctor.checks.base import (
    Context,
    Outcome,
    Remedy,
    check,
    failed,
    passed,
    plural,
    skipped,
)
from ct200_tools.doctor.checks.host import host_side, no_host
from ct200_tools.facts import LxcConfFacts
from ct200_tools.host import pvecfg

TAG = "lxc_passthrough"


def _conf(ctx: Context) -> tuple[LxcConfFacts, pvecfg.Config | None] | Outcome:
    """The config as read and parsed (None when the file does not exist), or why not."""
    h = ctx.facts.host
    if h is None:
        return no_host(ctx)
    c = h.lxc
    if c is None:
        why = ctx.unreadable("host.lxc") or "the site spec has no pve section (pve.vmid)"
        return skipped("the container's config was not read", why)
    if not c.exists:
        return c, None
    if c.text is None:
        return skipped(f"{c.path} was not readable", ctx.unreadable("host.lxc") or "")
    return c, pvecfg.parse(c.text)


def _majors(ctx: Context) -> dict[str, int] | None:
    h = ctx.facts.host
    d = h.devices if h is not None else None
    if d is None or ctx.unreadable("host.devices.proc_devices"):
        return None
    return d.majors


def _plan(c: LxcConfFacts, config: pvecfg.Config, ctx: Context) -> pvecfg.Plan | str:
    """The edit the ct200_pve_lxc_gpu module would make, or why it would refuse."""
    want = pvecfg.Want(
        tuple(dev.passthrough_nodes(ctx)), c.passthrough, "0666", _majors(ctx) or None
    )
    try:
        return pvecfg.plan(config, want)
    except pvecfg.PveConfigError as exc:
        return str(exc)


def _restart(c: LxcConfFacts) -> str:
    return f"then pct reboot {c.vmid} (the container reads its config at start)"


def _edit_fix(c: LxcConfFacts, ctx: Context, diff: list[str], what: str) -> Remedy:
    return Remedy(
        f"in {c.path}, {what}: change the lines marked - into those marked + (the "
        f"{TAG} tag makes exactly this edit, under pve-container's config lock), " + _restart(c),
        host_side(ctx),
        None,
        TAG,
        tuple(diff),
        c.path,
    )


def _refused(c: LxcConfFacts, ctx: Context, why: str) -> Remedy:
    return Remedy(f"{why} ({c.path})", host_side(ctx), None, TAG)


def _no_conf(c: LxcConfFacts, ctx: Context) -> Outcome:
    h = ctx.facts.host
    on = f"host {h.hostname}" if h is not None and h.hostname else "the host"
    return failed(
        f"container {c.vmid} has no config on {on}: {c.path} does not exist",
        Remedy(
            "the site spec's pve.vmid names no container on this host (`pct list` shows "
            "them): fix pve.vmid, or give --host the container's own PVE host",
            host_side(ctx),
            "pct list",
            None,
        ),
    )


@check(
    "lxc.nodes",
    "LXC config passes every NVIDIA node",
    "error",
    needs=("host",),
    needs_spec=True,
    tags=(TAG,),
    gpu_only=True,
)
def check_lxc_nodes(ctx: Context) -> Outcome:
    """The container's config passes every node it needs (/dev/nvidia0..N-1, nvidiactl,
    nvidia-uvm, nvidia-uvm-tools): a devN entry (PVE 8.1+; pve-container allows the node's
    current major at every start) or an lxc.mount.entry bind mount (raw-lxc, whose allow rules
    lxc.majors judges). A node that is not passed does not exist in the container (dev.nodes
    fails there). The fix is `pct set VMID -devN PATH,mode=0666` for devN, the lines to add for
    raw-lxc."""
    got = _conf(ctx)
    if isinstance(got, Outcome):
        return got
    c, config = got
    if config is None:
        return _no_conf(c, ctx)
    want = dev.passthrough_nodes(ctx)
    passed_by = pvecfg.passed_nodes(config)
    missing = [n for n in want if n not in passed_by]
    evidence = [f"{c.path} ({c.passthrough}): {passed_by[n]}" for n in want if n in passed_by]
    lock = config.main_value("lock")
    if lock is not None:
        evidence.append(f"{c.path} has 'lock: {lock}': a {lock} is running on the container")
    if not missing:
        return passed(f"{plural(len(want), 'node')} passed through", *evidence)
    edit = _plan(c, config, ctx)
    summary = f"{len(missing)} of {plural(len(want), 'NVIDIA node')} not passed to the container"
    absent = [f"{n}: no devN entry or lxc.mount.entry in {c.path}" for n in missing]
    if isinstance(edit, str):
        return failed(summary, _refused(c, ctx, edit), *absent, *evidence)
    added = [pvecfg.classify(t) for t in edit.added]
    devs = [ln for ln in added if ln.dev_index is not None]
    if c.passthrough == "devn" and devs and len(devs) == len(added) and not edit.removed:
        return failed(
            summary,
            Remedy(
                f"pass the nodes with devN entries (the {TAG} tag writes them too), " + _restart(c),
                host_side(ctx),
                f"pct set {c.vmid} " + " ".join(f"-{ln.key} {ln.value}" for ln in devs),
                TAG,
            ),
            *absent,
            *evidence,
        )
    diff = [f"-{old}" for old in edit.removed] + [f"+{new}" for new in edit.added]
    return failed(summary, _edit_fix(c, ctx, diff, "pass the nodes"), *absent, *evidence)


@check(
    "lxc.majors",
    "LXC config allows the host's current majors",
    "error",
    needs=("host",),
    needs_spec=True,
    tags=(TAG,),
    gpu_only=True,
)
def check_lxc_majors(ctx: Context) -> Outcome:
    """Every node the config bind-mounts (raw-lxc) has an lxc.cgroup2.devices.allow rule for its
    driver's major as the host's /proc/devices gives it now, and no allow rule names a dynamic
    major that no driver holds: nvidia-uvm's major is dynamic and moves after a driver update,
    leaving a rule for the old one (the incident's 509) while the container gets EPERM. The fix
    shows the stale line and the line that replaces it. With devN entries only, pve-container
    allows the current majors itself: a stale rule is then a leftover (warning)."""
    got = _conf(ctx)
    if isinstance(got, Outcome):
        return got
    c, config = got
    if config is None:
        return skipped(f"{c.path} does not exist (see lxc.nodes)", caused_by="lxc.nodes")
    majors = _majors(ctx)
    if majors is None:
        return skipped(
            "the host's /proc/devices was not read", ctx.unreadable("host.devices") or ""
        )
    if "nvidia-uvm" not in majors:
        return skipped(
            "nvidia_uvm is not loaded on the host, so its major is unknown (see host.nodes)",
            caused_by="host.nodes",
        )
    live = set(majors.values())
    rules = pvecfg.allow_rules(config)
    stale = [r for r in rules if pvecfg.is_stale(r, live)]
    passed_by = pvecfg.passed_nodes(config)
    mounted = [
        n
        for n in dev.passthrough_nodes(ctx)
        if n in passed_by and pvecfg.classify(passed_by[n]).dev_index is None
    ]
    need: dict[int, list[str]] = {}
    for n in mounted:
        m = pvecfg.major_of(pvecfg.driver_of(n) or "", majors)
        if m is not None:
            need.setdefault(m, []).append(n)
    missing = {m: ns for m, ns in need.items() if not pvecfg.allows(rules, m)}
    nvidia = {k: v for k, v in majors.items() if k.startswith("nvidia")}
    evidence = [f"host /proc/devices: {nvidia}", *(f"{c.path}: {r.line}" for r in rules)]
    if not stale and not missing:
        what = (
            f"allow rules cover the majors of {plural(len(mounted), 'mounted node')}"
            if mounted
            else "no allow rule names a stale major (devN entries: pve-container allows them)"
        )
        return passed(what, *evidence)
    diff = _majors_diff(stale, missing)
    parts = [
        f"an allow rule for major {r.major}, which no driver holds now (nvidia-uvm is "
        f"{majors['nvidia-uvm']})"
        for r in stale
    ] + [
        f"no allow rule for major {m} ({', '.join(ns)}: the container gets EPERM)"
        for m, ns in sorted(missing.items())
    ]
    return failed(
        "; ".join(parts),
        _edit_fix(c, ctx, diff, "allow the current majors"),
        *evidence,
        warn_only=not missing,
    )


def _majors_diff(stale: list[pvecfg.AllowRule], missing: dict[int, list[str]]) -> list[str]:
    """Each stale rule becomes a missing major's rule where it stands (old line, then new
    line), as the ct200_pve_lxc_gpu module's raw-lxc edit does; what is left is deleted or
    added. Dynamic majors (nvidia-uvm's) pair first: the stale rule was theirs."""
    want = sorted(missing, key=lambda m: (not pvecfg.is_dynamic(m), m))
    out: list[str] = []
    for i, rule in enumerate(stale):
        out.append(f"-{rule.line}")
        if i < len(want):
            out.append(f"+{pvecfg.ALLOW_KEY}: c {want[i]}:* rwm")
    out += [f"+{pvecfg.ALLOW_KEY}: c {m}:* rwm" for m in want[len(stale) :]]
    return out
