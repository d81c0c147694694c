"""Shared by the spec tests: the example site, edits of it by spec path, and issue lookups."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ct200_tools.spec import SPEC_KEY, SpecError, SpecIssue, validate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "inventory" / "ct200"
EXAMPLE_FILE = EXAMPLE_DIR / "group_vars" / "all" / "ct200_site.yml"
DROP = object()  # in a change table: delete the key


def example() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_FILE.read_text())[SPEC_KEY]
    assert isinstance(data, dict)
    return copy.deepcopy(data)


def tokens(path: str) -> list[str | int]:
    return [int(i) if i else k for k, i in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path)]


def changed(changes: dict[str, object]) -> dict[str, Any]:
    """The example with values set (or DROPped) at spec paths such as servers[1].gpus."""
    data = example()
    for path, value in changes.items():
        *head, last = tokens(path)
        target: Any = data
        for token in head:
            target = target[token]
        if value is DROP:
            del target[last]
        else:
            target[last] = value
    return data


def issues_of(data: object) -> list[SpecIssue]:
    with pytest.raises(SpecError) as caught:
        validate(data)
    return caught.value.issues


def issue_at(issues: list[SpecIssue], path: str, fragment: str, severity: str) -> SpecIssue:
    found = [i for i in issues if i.path == path and i.severity == severity]
    assert found, f"no {severity} at {path}; got: {[str(i) for i in issues]}"
    matching = [i for i in found if fragment in f"{i.message} {i.fix}"]
    assert matching, f"{fragment!r} not in {[str(i) for i in found]}"
    assert matching[0].fix.strip()
    return matching[0]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path
