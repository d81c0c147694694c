"""``systemd-analyze verify`` for the units the roles render, failing on any output.

``systemd-analyze verify`` exits 0 on a misspelled key (it only warns "Unknown key ... ignoring"),
so a unit passes only when the command exits 0 *and* prints nothing on stderr. Units are verified
where they are installed (on a testbed machine after a converge, so that ExecStart= paths exist),
and static unit files in the repository are verified on the controller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

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
