"""Every check's pass and fail examples, from beside the check
(ct200_tools/doctor/checks/examples/).

One file per check, `<check-id>.yml`, each example a recorded or derived facts file of
tests/fixtures/facts, a few edits on it (`set`/`delete`, JSON Pointer paths), the site spec,
and the verdict (status, summary, fix) that the check must give. This test finds them all, runs
each one through the check unit, and keeps the set whole (as ansible-lint's test does for its
rules): one file per registered check, each naming its check, names unique and well formed,
a pass and a failure for every check. The format: ct200_tools/doctor/checks/examples/README.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ct200_tools.doctor.checks import BY_ID, CHECK_IDS
from ct200_tools.doctor.checks.base import STATUSES, Context, run_check
from ct200_tools.facts import Facts, loads
from ct200_tools.spec import SiteSpec, load_spec

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "ct200_tools" / "doctor" / "checks" / "examples"
FACTS_DIR = "tests/fixtures/facts/"
FACT_SECTIONS = (
    "kernel",
    "devices",
    "pci",
    "nvml",
    "cuda",
    "memory",
    "models",
    "serving",
    "servers",
    "host",
)
FILE_KEYS = {"check", "examples"}
EXAMPLE_KEYS = {"name", "about", "facts", "set", "delete", "spec", "enabled", "expect"}
EXPECT_KEYS = {
    *("status", "summary", "evidence", "caused_by"),
    *("action", "where", "command", "config", "file", "tag"),
}
NAME = re.compile(r"(pass|fail|warn|skip|error)-[a-z0-9]+(-[a-z0-9]+)*")


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yml"))


@functools.cache
def load_file(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def all_examples() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(doc["check"]), ex)
        for path in example_files()
        for doc in [load_file(path)]
        for ex in doc.get("examples") or ()
    ]


@functools.cache
def base_facts(rel: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((ROOT / rel).read_text())
    return raw


@functools.cache
def spec_at(rel: str) -> SiteSpec:
    return load_spec(ROOT / rel)


def _step(parent: Any, token: str) -> Any:
    return parent[int(token)] if isinstance(parent, list) else parent[token]


def _pointer(doc: Any, pointer: str) -> tuple[Any, str]:
    """The container and last token of a JSON Pointer (RFC 6901) into the facts document."""
    assert pointer.startswith("/"), f"{pointer!r}: a JSON Pointer starts with /"
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    for token in tokens[:-1]:
        doc = _step(doc, token)
    return doc, tokens[-1]


def example_facts(ex: dict[str, Any]) -> Facts:
    """The base facts file with the example's edits, read as `check --facts` reads a file."""
    doc = copy.deepcopy(base_facts(ex["facts"]))
    for pointer, value in (ex.get("set") or {}).items():
        parent, last = _pointer(doc, pointer)
        if isinstance(parent, list):
            parent[int(last)] = value
        else:
            parent[last] = value
    for pointer in ex.get("delete") or ():
        parent, last = _pointer(doc, pointer)
        _step(parent, last)  # a delete of what is not there is a mistake in the example
        del parent[int(last) if isinstance(parent, list) else last]
    return loads(json.dumps(doc))


def example_spec(ex: dict[str, Any]) -> SiteSpec | None:
    """The spec file; `enabled` lists the servers enabled instead of the file's choice."""
    if ex.get("spec") is None:
        return None
    spec = spec_at(ex["spec"])
    if "enabled" in ex:
        on = set(ex["enabled"])
        assert on <= {s.name for s in spec.servers}, ex["enabled"]
        servers = tuple(dataclasses.replace(s, enabled=s.name in on) for s in spec.servers)
        spec = dataclasses.replace(spec, servers=servers)
    return spec


def only_sections(f: Facts, keep: tuple[str, ...]) -> Facts:
    """The facts with every section the check does not declare taken away."""
    return dataclasses.replace(f, **dict.fromkeys(set(FACT_SECTIONS) - set(keep)))


def test_one_example_file_per_registered_check() -> None:
    stems = [p.stem for p in example_files()]
    assert sorted(stems) == sorted(CHECK_IDS), (
        "each check needs ct200_tools/doctor/checks/examples/ID.yml"
    )
    for path in example_files():
        doc = load_file(path)
        assert set(doc) == FILE_KEYS, (path.name, set(doc) ^ FILE_KEYS)
        assert doc["check"] == path.stem, f"{path.name} names {doc['check']}"
        assert doc["check"] in BY_ID, f"{path.name}: {doc['check']} is not a registered check"


def test_every_check_has_a_pass_and_a_failure() -> None:
    for path in example_files():
        statuses = {ex["expect"]["status"] for ex in load_file(path)["examples"]}
        assert "pass" in statuses, f"{path.name}: no pass example"
        assert statuses & {"fail", "warn"}, f"{path.name}: no fail or warn example"


def test_example_names_and_fields_are_well_formed() -> None:
    for path in example_files():
        names = [ex.get("name") for ex in load_file(path)["examples"]]
        assert len(set(names)) == len(names), f"{path.name}: a name repeats"
        for ex in load_file(path)["examples"]:
            where = f"{path.name}: {ex.get('name')}"
            assert set(ex) <= EXAMPLE_KEYS, (where, set(ex) - EXAMPLE_KEYS)
            assert {"name", "facts", "spec", "expect"} <= set(ex), where
            expect = ex["expect"]
            assert set(expect) <= EXPECT_KEYS, (where, set(expect) - EXPECT_KEYS)
            assert expect["status"] in STATUSES and expect.get("summary"), where
            # The name says its verdict, so a list of names reads as the check's cases.
            assert NAME.fullmatch(ex["name"]) and ex["name"].startswith(expect["status"]), where
            assert ex["facts"].startswith(FACTS_DIR), (where, ex["facts"])
            if expect["status"] == "fail":
                assert "action" in expect, f"{where}: say the fix"
            if "action" in expect:
                assert "where" in expect, f"{where}: say where the fix applies"


@pytest.mark.parametrize(
    ("cid", "ex"),
    all_examples(),
    ids=[f"{cid}/{ex.get('name')}" for cid, ex in all_examples()],
)
def test_example(cid: str, ex: dict[str, Any]) -> None:
    c = BY_ID[cid]
    ctx = Context(example_facts(ex), example_spec(ex))
    got = run_check(c, ctx)
    expect = ex["expect"]
    assert got.status == expect["status"], got
    assert (got.id, got.title, got.severity) == (c.id, c.title, c.severity)
    # The stable part of the verdict: the example's text is in the finding's.
    assert expect["summary"] in got.summary, got.summary
    for line in expect.get("evidence") or ():  # each in one of the finding's evidence lines
        assert any(line in e for e in got.evidence), (line, got.evidence)
    assert got.caused_by == expect.get("caused_by"), got
    fix = got.remediation
    if "action" not in expect:  # a pass, a skip, or a warning with nothing to do yet
        assert fix is None, fix
    else:
        assert fix is not None, got
        assert expect["action"] in fix.action, fix
        assert fix.where == expect["where"], fix
        assert expect.get("command", "") in (fix.command or ""), fix
        # Config lines are said apart from commands, with the file they belong in.
        assert expect.get("config", "") in "\n".join(fix.config), fix
        assert fix.file == expect.get("file"), fix
        assert fix.tag == expect.get("tag"), fix
        assert fix.tag is None or fix.tag in c.tags, fix
    # `needs` is the truth: without the other sections the verdict is the same.
    alone = run_check(c, Context(only_sections(ctx.facts, c.needs), ctx.spec))
    assert alone == got


def test_a_wrong_expectation_fails() -> None:
    """The runner is not a rubber stamp: an example whose verdict is changed fails."""
    cid, ex = next((cid, ex) for cid, ex in all_examples() if ex["expect"]["status"] == "fail")
    for changed in (
        {"status": "pass"},
        {"summary": "no such text"},
        {"command": "rm -rf /"},
        {"evidence": ["no such line"]},
    ):
        wrong = {**ex, "expect": {**ex["expect"], **changed}}
        with pytest.raises(AssertionError):
            test_example(cid, wrong)
