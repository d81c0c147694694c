"""Reading the site spec from a YAML file or an Ansible inventory directory, then validating it.

YAML is parsed safely and refuses duplicate keys; templated (Jinja) values are refused, since the
doctor reads the spec outside Ansible.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import yaml

from ct200_tools.spec import DEFAULT_SPEC_PATH, SPEC_KEY, SiteSpec, SpecError, SpecIssue
from ct200_tools.specload import ROOT, validate
from ct200_tools.specread import at, keyname, listing, show


def fail(source: str, message: str, fix: str) -> NoReturn:
    raise SpecError([SpecIssue(SPEC_KEY, message, fix)], source)


def read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(
            str(file),
            "no such file",
            "pass a site YAML file or an Ansible inventory directory; the playbooks write "
            f"{DEFAULT_SPEC_PATH} on every target",
        )
    except (OSError, UnicodeDecodeError) as exc:
        fail(str(file), f"cannot read it: {exc}", "check the path and its permissions")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key written twice: PyYAML keeps the last one silently, so a
    second `port:` would quietly win over the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        fail(
            source,
            f"YAML error{where}: {problem}",
            "fix the YAML there (a key written twice, indentation, a missing "
            "':' or an unclosed quote are the usual causes)",
        )
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML lets int() errors out (a number of thousands of digits) and recurses per level.
        fail(source, f"YAML error: {show(str(exc))}", "fix the YAML")


def from_file(file: Path) -> tuple[object, str]:
    doc = parse_yaml(read_text(file), str(file))
    if isinstance(doc, dict) and SPEC_KEY in doc:
        return doc[SPEC_KEY], str(file)
    if isinstance(doc, dict) and set(doc) & set(ROOT):
        fail(
            str(file),
            f"no top-level {SPEC_KEY}: this looks like a bare spec, which is not accepted",
            f"nest it under '{SPEC_KEY}:', the same key group_vars use, so every file that "
            "holds a spec says so",
        )
    fail(
        str(file),
        f"no top-level {SPEC_KEY} key",
        f"pass a file whose top level has {SPEC_KEY}:, or an inventory directory",
    )


def from_inventory(directory: Path) -> tuple[object, str]:
    """The one group_vars file that defines the spec (host_vars are not searched: one site)."""
    group_vars = directory / "group_vars"
    if not group_vars.is_dir():
        fail(
            str(directory),
            "is a directory without group_vars/",
            "pass an Ansible inventory directory (with group_vars/) or a site YAML file",
        )
    found: list[tuple[Path, object]] = []
    for file in sorted(group_vars.rglob("*")):
        if file.suffix not in (".yml", ".yaml") or not file.is_file():
            continue
        text = read_text(file)
        # Parse only candidates: other group_vars may hold tags (!vault) that safe_load refuses.
        doc = parse_yaml(text, str(file)) if SPEC_KEY in text else None
        if isinstance(doc, dict) and SPEC_KEY in doc:
            found.append((file, doc[SPEC_KEY]))
    if len(found) != 1:
        files = listing(str(f) for f, _ in found) or "none"
        fail(
            str(directory),
            f"{len(found)} group_vars files define {SPEC_KEY} (found: {files})",
            f"define {SPEC_KEY} in exactly one file, e.g. group_vars/all/{SPEC_KEY}.yml: "
            "Ansible would override one with another by group precedence",
        )
    return found[0][1], str(found[0][0])


def templated(value: object, path: str, seen: set[int]) -> list[SpecIssue]:
    """Jinja in values: the doctor reads the spec outside Ansible, where it is never rendered."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return []
        return [
            SpecIssue(
                path or SPEC_KEY,
                f"templated value {show(value)} is not supported",
                "write the literal value: the doctor reads this spec without Ansible",
            )
        ]
    if id(value) in seen:  # YAML anchors can make a list contain itself
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        return [i for k, v in value.items() for i in templated(v, at(path, keyname(k)), seen)]
    if isinstance(value, list):
        return [i for n, v in enumerate(value) for i in templated(v, at(path, n), seen)]
    return []


def load_spec(path: str | os.PathLike[str]) -> SiteSpec:
    target = Path(path)
    data, source = from_inventory(target) if target.is_dir() else from_file(target)
    jinja = templated(data, "", set())
    try:
        spec = validate(data, source)
    except SpecError as exc:
        raise SpecError(jinja + exc.issues, source) from None
    if jinja:
        raise SpecError(jinja, source)
    return spec
