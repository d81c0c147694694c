"""The stage package owns "is model X staged and intact"; the doctor's probes and checks call
into it, never the reverse (issue 18: the only arrows that ran back up the house)."""

from __future__ import annotations

import ast
from pathlib import Path

import ct200_tools.stage as stage_pkg

STAGE_DIR = Path(stage_pkg.__file__).parent
#: The doctor's packages, under today's names and the ones the integrator may give them.
DOCTOR = ("ct200_tools.doctor.checks", "ct200_tools.doctor.probes", "ct200_tools.doctor")


def imported(path: Path) -> list[str]:
    """Every module `path` imports, at module level or inside a function, relative imports
    resolved against ct200_tools.stage."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = ["ct200_tools", "stage"][: 3 - node.level] if node.level <= 2 else []
                base = ".".join([*parts, *([base] if base else [])])
            names += [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_stage_imports_nothing_of_the_doctor() -> None:
    modules = sorted(STAGE_DIR.glob("*.py"))
    assert len(modules) > 10, modules  # the walk found the package
    wrong = [
        f"{p.name} imports {name}"
        for p in modules
        for name in imported(p)
        if name.startswith(DOCTOR)
    ]
    assert wrong == []
