"""Every check's pass and fail examples, from beside the check
(ct200_tools/doctor/checks/examples/).

One file per check, `<check-id>.yml`, each example a recorded or derived facts file of
tests/fixtures/facts, a few edits on it (`set`/`delete`, JSON Pointer paths), the site spec,
and the verdict (status, summary, fix) that the check must give. This test finds them all, runs
each one through the check unit, and keeps the set whole (as ansible-lint's test does for its
rules): one file per registered check, each naming its check, names unique and well formed,
a pass and a failure for every check. Examples edit the spec as they edit the facts
(`spec_set`/`spec_delete`), so no check's example needs a change to the shared example site.
The format: ct200_tools/doctor/checks/examples/README.md.
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
from ct200_tools.spec import SiteSpec, load_spec, validate
from ct200_tools.spec.files import from_file, from_inventory

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
EXAMPLE_KEYS = {
    *("name", "about", "facts", "set", "delete"),
    *("spec", "spec_set", "spec_delete", "enabled", "expect"),
}
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
    """The container and last token of a JSON Pointer (RFC 6901) into a facts or spec document."""
    assert pointer.startswith("/"), f"{pointer!r}: a JSON Pointer starts with /"
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    for token in tokens[:-1]:
        doc = _step(doc, token)
    return doc, tokens[-1]


def edited(doc: Any, ex: dict[str, Any], set_key: str, delete_key: str) -> Any:
    """A copy of a document (facts or spec) with the example's JSON Pointer edits."""
    doc = copy.deepcopy(doc)
    for pointer, value in (ex.get(set_key) or {}).items():
        parent, last = _pointer(doc, pointer)
        if isinstance(parent, list):
            parent[int(last)] = value
        else:
            parent[last] = value
    for pointer in ex.get(delete_key) or ():
        parent, last = _pointer(doc, pointer)
        _step(parent, last)  # a delete of what is not there is a mistake in the example
        del parent[int(last) if isinstance(parent, list) else last]
    return doc


def example_facts(ex: dict[str, Any]) -> Facts:
    """The base facts file with the example's edits, read as `check --facts` reads a file."""
    return loads(json.dumps(edited(base_facts(ex["facts"]), ex, "set", "delete")))


@functools.cache
def spec_data(rel: str) -> tuple[Any, str]:
    """The spec's mapping (under ct200_site) as written, before validation, and its source."""
    path = ROOT / rel
    return from_inventory(path) if path.is_dir() else from_file(path)


def example_spec(ex: dict[str, Any]) -> SiteSpec | None:
    """The spec file, with the example's edits (`spec_set`/`spec_delete`, JSON Pointers into
    the mapping under ct200_site, validated as a spec file is: a check's example sets the spec
    it needs here, never in the shared example inventory); `enabled` lists the servers enabled
    instead of the file's choice."""
    if ex.get("spec") is None:
        assert not ex.get("spec_set") and not ex.get("spec_delete"), "edits of no spec"
        return None
    if ex.get("spec_set") or ex.get("spec_delete"):
        data, source = spec_data(ex["spec"])
        spec = validate(edited(data, ex, "spec_set", "spec_delete"), source)
    else:
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


def test_a_spec_edit_changes_the_verdict_and_a_bad_one_is_refused() -> None:
    """spec_set reaches the check (the same facts, another verdict) and is validated as a spec
    file is: an edit that makes no valid spec fails the example, it is never ignored."""
    from ct200_tools.spec import SpecError  # noqa: PLC0415 - beside its use

    base = {
        "name": "pass-x",
        "facts": FACTS_DIR + "ct200-ct-healthy.json",
        "spec": "inventory/ct200",
    }
    check = BY_ID["tune.numa_balancing"]
    assert run_check(check, Context(example_facts(base), example_spec(base))).status == "pass"
    wants_1 = {**base, "spec_set": {"/tuning/numa_balancing": 1}}
    got = run_check(check, Context(example_facts(wants_1), example_spec(wants_1)))
    assert (got.status, got.summary) == ("fail", "kernel.numa_balancing = 0, the spec wants 1")
    with pytest.raises(SpecError) as bad:
        example_spec({**base, "spec_set": {"/tuning/numa_balancing": 7}})
    assert [i.path for i in bad.value.issues] == ["tuning.numa_balancing"], bad.value.issues
    no_tuning = {**base, "spec_delete": ["/tuning"]}
    assert example_spec(no_tuning) is not None
