"""Every fix command the doctor's checks and the boot chains print is valid shell when pasted
literally (issue 19: the masked-unit fix put a parenthetical after the command, and
`inventory/<site>` pastes as two redirections). Commands: each check's Remedy for every recorded
facts fixture under every site spec we ship, and every fix of the container's and the host's
boot chain for each step state; `bash -n` parses each one.

Config lines (a devN line of /etc/pve/lxc/200.conf, a sysctl.d line) are not commands: a
Remedy carries them apart (`config`, with the `file` they go in), and no report prints one
after a `$` (issue 19, item 3: `$ dev0: /dev/nvidia0,mode=0666` pasted runs `dev0:`)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ct200_tools.doctor.checks import run_checks
from ct200_tools.doctor.checks.base import Finding
from ct200_tools.doctor.fleet import HostResult, Status, render_table, roots_of
from ct200_tools.doctor.report import Header, exit_code, gate_verdict, render_json, render_text
from ct200_tools.facts import Facts, loads
from ct200_tools.host.chain import fix_of as host_fix
from ct200_tools.serve import chain as ch
from ct200_tools.serve.bootsteps import STATES, Step
from ct200_tools.spec import SiteSpec, load_spec

ROOT = Path(__file__).parents[2]
FACTS = sorted((ROOT / "tests" / "fixtures" / "facts").glob("*.json"))
SPECS = {
    "none": None,
    "ct200": ROOT / "inventory" / "ct200",
    "h200": ROOT / "benchmarks" / "doctor" / "h200-site.yml",
    "llama": ROOT / "tests" / "fixtures" / "llama-cpu-site.yml",
}
#: A placeholder in angle brackets is two redirections when pasted (`-i inventory/<site>`).
ANGLE_PLACEHOLDER = re.compile(r"<[A-Za-z_][A-Za-z0-9_ -]*>")


#: What a config line looks like, in every file the checks name (PVE container config, sysctl.d,
#: /etc/default/grub, a systemd unit): what must never be printed as a command.
CONFIG_LINE = re.compile(
    r"^[-+]?(dev\d+: |lxc\.[\w.]+[:=] ?|DeviceAllow=|[a-z_]+\.[\w.]+ = |GRUB_CMDLINE_\w+=)"
)


def runs() -> list[tuple[str, Facts, list[Finding]]]:
    """Every recorded facts fixture judged under every shipped spec: (name, facts, findings)."""
    specs: dict[str, SiteSpec | None] = {
        k: (load_spec(v) if v is not None else None) for k, v in SPECS.items()
    }
    out = []
    for path, (name, spec) in itertools.product(FACTS, specs.items()):
        facts = loads(path.read_text())
        out.append((f"{path.stem} ({name})", facts, run_checks(facts, spec)))
    return out


RUNS = runs()


def remedy_commands() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, _, findings in RUNS:
        for finding in findings:
            r = finding.remediation
            if r is not None and r.command:
                out += [(f"{name}: {finding.id}", line) for line in r.command.splitlines()]
    return out


def commands_of(fix: str) -> list[str]:
    """The commands a fix line carries: each between backquotes; with none, the line is what a
    person pastes."""
    return fix.split("`")[1::2] if "`" in fix else [fix]


def chain_commands() -> list[tuple[str, str]]:
    """The backquoted commands of every chain fix: container steps of each kind, state and
    failing command; the host's steps of each state (and a unit that is not installed)."""
    out = []
    for kind, state, failed_at in itertools.product(
        ("stage", "server"), STATES, ("", "gate", "preflight", "ready", "engine")
    ):
        if state == "ok":
            continue
        step = Step(
            kind, "tiny", f"ct200-{kind}-tiny.service", state, "inactive", None, None, failed_at
        )
        out += [(f"chain {kind} {state} {failed_at}", c) for c in commands_of(ch.fix_of(step))]
    for state, detail in [(s, "inactive (dead), disabled") for s in STATES if s != "ok"] + [
        ("off", "unit not-found")
    ]:
        step = Step("host", "host-devices", "ct200-host-devices.service", state, detail)
        out += [(f"host {state} {detail}", c) for c in commands_of(host_fix(step))]
    return out


def test_every_printed_fix_is_valid_shell() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    commands = remedy_commands() + chain_commands()
    assert len(commands) > 20  # the fixtures do print fixes: this test sees them
    bad = []
    for where, command in commands:
        # On standard input, as a paste reaches the shell: `bash -c` would take a line that
        # starts with "-" for its own options.
        proc = subprocess.run(
            [bash, "-n"], input=command, capture_output=True, text=True, timeout=10, check=False
        )
        if proc.returncode != 0 or ANGLE_PLACEHOLDER.search(command):
            bad.append(f"{where}: {command!r}: {proc.stderr.strip() or 'an <angle> placeholder'}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("state", [s for s in STATES if s != "ok"])
def test_chain_fixes_name_a_command_in_backquotes(state: str) -> None:
    """The chain's fix for each state carries its command whole, so the test above sees it."""
    step = Step("server", "tiny", "ct200-server-tiny.service", state, "inactive", None, None, "")
    assert "`" in ch.fix_of(step)


def test_config_lines_are_never_commands() -> None:
    """No fix prints a config line as a command: not among a Remedy's commands (which the test
    above only parses), not after a `$` in the text view or the fleet table, not as the gate's
    one-line fix."""
    bad = []
    for name, facts, findings in RUNS:
        code = exit_code(findings)
        head = Header(facts, "spec")
        report = json.loads(render_json(findings, head, code))
        row = HostResult("h", Status.FAIL, "", report=report, roots=roots_of(report))
        shown = render_text(findings, head) + render_table([row])
        dollar = [ln.split("$ ", 1)[1] for ln in shown.splitlines() if "$ " in ln]
        bad += [f"{name}: after a $: {ln!r}" for ln in dollar if CONFIG_LINE.match(ln)]
        gate = gate_verdict(findings, "s", code)
        if re.search(r"fix on [\w ]+: [-+]?(dev\d|lxc\.|DeviceAllow)", gate):
            bad.append(f"{name}: the gate gives a config line as the fix: {gate!r}")
        for f in findings:
            commands = (f.remediation.command or "").splitlines() if f.remediation else []
            bad += [f"{name}: {f.id}: command {c!r}" for c in commands if CONFIG_LINE.match(c)]
    assert not bad, "\n".join(bad)


def test_config_lines_name_their_file() -> None:
    """Each config line comes with the file it goes in (a path, or the place when no path
    names it), is printed as `in FILE: LINE`, and the JSON keeps lines and file apart from the
    commands."""
    configs = 0
    for name, facts, findings in RUNS:
        head = Header(facts, "spec")
        text = render_text(findings, head)
        report = json.loads(render_json(findings, head, exit_code(findings)))
        by_id = {c["id"]: c for c in report["checks"]}
        for f in findings:
            r = f.remediation
            if r is None:
                continue
            fix = by_id[f.id]["remediation"]
            assert (fix["command"], fix["config"], fix["file"]) == (
                r.command,
                list(r.config),
                r.file,
            ), (name, f.id)
            for line in r.config:
                configs += 1
                assert r.file and (r.file.startswith("/") or " " in r.file), (name, f.id)
                if f.status in ("fail", "warn") and not f.caused_by:
                    assert f"in {r.file}: {line}" in text, (name, f.id, line)
    assert configs > 10  # the fixtures do print config lines: this test sees them
