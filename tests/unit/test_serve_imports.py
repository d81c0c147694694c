"""No arrow back up (issue 30): serve/ and the engine modules import nothing of the doctor (the
HTTP questions are ct200_tools/serverhttp.py's, the engine child is engines/base.py's), and the
engine modules import nothing of the spec at run time (the spec reads them while it
validates)."""

from __future__ import annotations

import ast
from pathlib import Path

import ct200_tools

ROOT = Path(ct200_tools.__file__).parent


def imports(path: Path, *, runtime_only: bool = False) -> list[str]:
    """Every module `path` imports (at module level or in a function); with runtime_only,
    not those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_serve_and_engines_import_nothing_of_the_doctor() -> None:
    files = [*sorted((ROOT / "serve").glob("*.py")), *sorted((ROOT / "engines").glob("*.py"))]
    files.append(ROOT / "serverhttp.py")
    assert len(files) > 15, files  # the walk found the packages
    wrong = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in files
        for name in imports(p)
        if name.startswith("ct200_tools.doctor")
    ]
    assert wrong == []


def test_engine_modules_import_nothing_of_the_spec_at_run_time() -> None:
    files = sorted((ROOT / "engines").glob("*.py"))
    assert len(files) >= 5, files
    wrong = [
        f"{p.name} imports {name}"
        for p in files
        for name in imports(p, runtime_only=True)
        if name.startswith(("ct200_tools.spec", "ct200_tools.serve"))
    ]
    assert wrong == []
