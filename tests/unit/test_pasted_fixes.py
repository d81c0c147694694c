"""Every fix command the doctor's checks and the boot chains print is valid shell when pasted
literally (issue 19: the masked-unit fix put a parenthetical after the command, and
`inventory/<site>` pastes as two redirections). Commands: each check's Remedy for every recorded
facts fixture under every site spec we ship, and every fix of the container's and the host's
boot chain for each step state; `bash -n` parses each one."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ct200_tools.bootsteps import STATES, Step
from ct200_tools.checks import run_checks
from ct200_tools.facts import loads
from ct200_tools.hostchain import fix_of as host_fix
from ct200_tools.serve import chain as ch
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


def remedy_commands() -> list[tuple[str, str]]:
    specs: dict[str, SiteSpec | None] = {
        k: (load_spec(v) if v is not None else None) for k, v in SPECS.items()
    }
    out: list[tuple[str, str]] = []
    for path, (name, spec) in itertools.product(FACTS, specs.items()):
        for finding in run_checks(loads(path.read_text()), spec):
            r = finding.remediation
            if r is not None and r.command:
                where = f"{path.stem} ({name}): {finding.id}"
                out += [(where, line) for line in r.command.splitlines()]
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
