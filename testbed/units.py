"""``systemd-analyze verify`` for the units the roles render, failing on any output.

``systemd-analyze verify`` exits 0 on a misspelled key (it only warns "Unknown key ... ignoring"),
so a unit passes only when the command exits 0 *and* prints nothing on stderr. Units are verified
where they are installed (on a testbed machine after a converge, so that ExecStart= paths exist),
static unit files in the repository on the controller, and rendered units (every server of a
spec) on the controller too, in a scratch root (``verify_rendered``): systemd-analyze resolves the
unit's programs there, so each gets a named stand-in, since SGLang and ct200-tools' venv are not
installed on the controller.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ct200_tools.serve.engines import exec_words

UNIT_SUFFIXES = (
    ".service",
    ".socket",
    ".timer",
    ".path",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".slice",
)
#: Where roles install units; snapshotted before and after a converge to find what they rendered.
UNIT_DIRS = ("/etc/systemd/system", "/usr/local/lib/systemd/system")

#: Runs an argv, returns (exit status, stdout, stderr).
RunFn = Callable[[Sequence[str]], tuple[int, str, str]]


@dataclass(frozen=True)
class Problem:
    unit: str
    output: str

    def __str__(self) -> str:
        return f"{self.unit}:\n  " + self.output.strip().replace("\n", "\n  ")


def is_unit(path: str) -> bool:
    return path.endswith(UNIT_SUFFIXES)


def units_of(paths: Iterable[str]) -> list[str]:
    """Unit files among ``paths``; a drop-in (``foo.service.d/x.conf``) stands for its unit."""
    found: set[str] = set()
    for p in paths:
        parent = str(Path(p).parent)
        if is_unit(p):
            found.add(p)
        elif p.endswith(".conf") and parent.endswith(tuple(s + ".d" for s in UNIT_SUFFIXES)):
            found.add(parent.removesuffix(".d"))
    return sorted(found)


def verify(units: Iterable[str], run: RunFn) -> list[Problem]:
    """Verify each unit on its own, so every message is attributed to its unit."""
    problems = []
    for unit in units:
        rc, out, err = run(["systemd-analyze", "verify", unit])
        if rc != 0 or err.strip():
            problems.append(Problem(unit, err.strip() or out.strip() or f"exit {rc}"))
    return problems


def repo_units(repo: Path) -> list[str]:
    """Static unit files shipped in the repository (rendered templates are verified on the
    testbed instead, where they are installed)."""
    found: list[Path] = []
    for top in ("roles", "templates"):
        base = repo / top
        if base.is_dir():
            found += [p for p in base.rglob("*") if p.is_file() and is_unit(p.name)]
    return sorted(str(p) for p in found)


#: The system's own units (sysinit.target, ...), which verify loads as dependencies.
SYSTEM_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
#: The program of an Exec*= line: the first word after the prefixes (@-:+!|).
_EXEC = re.compile(r"^Exec\w+=[-@:+!|]*\"?([^\s\"]+)", re.MULTILINE)
STANDIN = (
    "#!/bin/sh\n# Stand-in written by testbed/units.py for `systemd-analyze verify --root`: the\n"
    "# real program is on the target machine, not on this controller.\nexit 0\n"
)


def unquote(line: str) -> list[str]:
    """How systemd splits an Exec*= line: the project's own reading (engines.exec_words)."""
    return exec_words(line)


def programs(unit_text: str) -> list[str]:
    """The programs a unit's Exec*= lines run (absolute paths, or names systemd looks up)."""
    return sorted({m.group(1) for m in _EXEC.finditer(unit_text)})


def verify_rendered(units: Mapping[str, str], run: RunFn) -> list[Problem]:
    """Verify rendered units (file name -> text) in a scratch root holding the system's units and
    a stand-in for each program they run; each unit on its own, failing on any stderr."""
    with tempfile.TemporaryDirectory(prefix="ct200-verify-") as tmp:
        root = Path(tmp)
        system = next((Path(d) for d in SYSTEM_UNIT_DIRS if Path(d).is_dir()), None)
        if system is not None:
            shutil.copytree(system, root / "usr/lib/systemd/system", symlinks=True)
        unit_dir = root / "etc/systemd/system"
        unit_dir.mkdir(parents=True)
        for name, text in units.items():
            (unit_dir / name).write_text(text)
            for program in programs(text):
                path = root / (program.lstrip("/") if "/" in program else f"usr/bin/{program}")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(STANDIN)
                path.chmod(0o755)
        problems = []
        for name in units:
            rc, out, err = run(
                ["systemd-analyze", "verify", f"--root={root}", f"/etc/systemd/system/{name}"]
            )
            if rc != 0 or err.strip():
                problems.append(Problem(name, err.strip() or out.strip() or f"exit {rc}"))
        return problems


def render_servers(spec: str) -> dict[str, str]:
    """The unit of every server of a site spec, as the inference_servers role renders it."""
    from ct200_tools.serve.engines import unit_name  # noqa: PLC0415
    from ct200_tools.serve.render import render  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415

    site = load_spec(spec)
    return {unit_name(s.name): render(site, s.name).unit for s in site.servers}
