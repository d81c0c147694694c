"""Reading untrusted YAML data into typed values, collecting every problem instead of stopping.

Schema-agnostic: a Section checks one mapping's keys against a table of examples and its getters
turn values into ints, strings, paths and sizes, recording each problem with its path and a fix.
The site's own schema and rules are in ct200_tools.spec.schema and ct200_tools.spec.servers.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from posixpath import normpath
from typing import Final

from ct200_tools.spec.model import SPEC_KEY, SpecIssue
from ct200_tools.spec.sizes import NoUnitError, parse_size

NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each would end a line
#: (or worse) in the systemd units and EnvironmentFiles that values are written into.
CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: The fix for a control character, wherever it is.
ONE_LINE: Final = (
    "remove it: values are written into systemd units and EnvironmentFiles, where a newline "
    "would start a line of its own; write the value on one line, without control characters"
)


def show(value: object) -> str:
    """repr() for messages: short, and safe for ints too long for str() (Python >= 3.11 refuses)."""
    try:
        text = repr(value)
    except ValueError:
        return "<a very large number>"
    return text if len(text) <= 60 else text[:57] + "..."


def kind(value: object) -> str:
    # YAML's words, since the reader wrote YAML, not Python.
    names = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"))
    for typ, name in (*names, (list, "a list"), (dict, "a mapping")):
        if isinstance(value, typ):
            return name
    return "null" if value is None else type(value).__name__


def at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def keyname(key: object) -> str:
    """A key as a path part; quoted where it could not be told apart from the path's syntax."""
    plain = isinstance(key, str) and re.fullmatch(r"[^.\[\]\s'\"]+", key)
    return key if plain and isinstance(key, str) else show(key)


def listing(values: Iterable[object]) -> str:
    return ", ".join(str(v) for v in values)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def control(text: str) -> str | None:
    """What is wrong when text holds a control character (which, and where), else None."""
    found = CONTROL_RE.search(text)
    if found is None:
        return None
    return f"contains the control character {found.group()!r} at position {found.start()}"


def scalar_text(value: object) -> str | None:
    """Numbers become their YAML text (env values, argv); bools are refused as ambiguous."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:
            return None
    return None


class Issues:
    """Every finding of one validation, errors and warnings, in the order found."""

    def __init__(self) -> None:
        self.items: list[SpecIssue] = []

    def error(self, path: str, message: str, fix: str) -> None:
        self.items.append(SpecIssue(path, message, fix))

    def one_line(self, path: str, text: str) -> bool:
        """Records an error when text holds a control character; True when it is clean."""
        problem = control(text)
        if problem is not None:
            self.error(path, problem, ONE_LINE)
        return problem is None

    def warn(self, path: str, message: str, fix: str) -> None:
        self.items.append(SpecIssue(path, message, fix, "warning"))

    def of(self, severity: str) -> list[SpecIssue]:
        return [i for i in self.items if i.severity == severity]


class Section:
    """One mapping whose keys were checked; typed getters record what is wrong with a value.

    A getter returns None when the key is absent, null where null is allowed, or invalid (already
    recorded), so callers only apply defaults.
    """

    def __init__(
        self, issues: Issues, data: dict[str, object], path: str, examples: Mapping[str, str]
    ) -> None:
        self.issues = issues
        self.data = data
        self.path = path
        self.examples = examples

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def where(self, key: str) -> str:
        return at(self.path, key)

    def raw(self, key: str, *, nullable: bool = True) -> object:
        value = self.data.get(key)
        if value is None and key in self.data and not nullable:
            self.issues.error(
                self.where(key),
                "is null",
                f"give a value, e.g. {self.examples[key]}, or remove the key where it is optional",
            )
        return value

    def bad(self, key: str, value: object, expected: str) -> None:
        unquote = isinstance(value, str) and value.strip().isdigit() and expected == "an integer"
        self.issues.error(
            self.where(key),
            f"expected {expected}, got {kind(value)} {show(value)}",
            f"write {expected}, e.g. {self.examples[key]}"
            + ("; write the number without quotes" if unquote else ""),
        )

    def get_int(
        self, key: str, lo: int, hi: int, *, choices: Sequence[int] = (), nullable: bool = False
    ) -> int | None:
        value = self.raw(key, nullable=nullable)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(key, value, "an integer")
        elif choices and value not in choices:
            self.issues.error(
                self.where(key),
                f"{show(value)} is not one of {listing(choices)}",
                f"use one of {listing(choices)}, e.g. {self.examples[key]}",
            )
        elif not lo <= value <= hi:
            self.issues.error(
                self.where(key),
                f"{show(value)} is out of range {lo}..{hi}",
                f"use a value from {lo} to {hi}, e.g. {self.examples[key]}",
            )
        else:
            return value
        return None

    def get_bool(self, key: str) -> bool | None:
        value = self.raw(key, nullable=False)
        if value is None or isinstance(value, bool):
            return value
        self.bad(key, value, "a boolean")
        return None

    def get_str(self, key: str, *, nullable: bool = False) -> str | None:
        value = self.raw(key, nullable=nullable)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.bad(key, value, "a non-empty string")
            return None
        return value if self.issues.one_line(self.where(key), value) else None

    def get_choice(self, key: str, choices: Sequence[str], *, upper: bool = False) -> str | None:
        value = self.get_str(key)
        normal = value.upper() if value is not None and upper else value
        if normal is None or normal in choices:
            return normal
        self.issues.error(
            self.where(key),
            f"{show(value)} is not one of {listing(choices)}{did_you_mean(normal, choices)}",
            f"use one of {listing(choices)}",
        )
        return None

    def get_name(self, key: str) -> str | None:
        value = self.get_str(key)
        if value is None or NAME_RE.match(value):
            return value
        self.issues.error(
            self.where(key),
            f"{show(value)} is not a valid name",
            "use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit "
            "(names become parts of unit and file names)",
        )
        return None

    def get_path(self, key: str, *, nullable: bool = False) -> str | None:
        value = self.get_str(key, nullable=nullable)
        if value is None or (value.startswith("/") and ".." not in value.split("/")):
            return None if value is None else normpath(value)
        self.issues.error(
            self.where(key),
            f"{show(value)} is not an absolute path without '..'",
            f"write the full path from /, e.g. {self.examples[key]}",
        )
        return None

    def get_size(self, key: str, *, nullable: bool = True) -> int | None:
        value = self.raw(key, nullable=nullable)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.bad(key, value, "a size")
            return None
        try:
            return parse_size(value, unit_required=True)
        except NoUnitError as exc:
            n = exc.number
            self.issues.error(
                self.where(key),
                str(exc),
                f"write the unit: {n}G for GiB, {n}M for MiB, or {n}B if you really mean bytes "
                "(K/M/G/T are binary, as for tmpfs)",
            )
        except ValueError as exc:
            self.issues.error(self.where(key), str(exc), f"write e.g. {self.examples[key]}")
        return None


def section(
    issues: Issues,
    value: object,
    path: str,
    examples: Mapping[str, str],
    required: Sequence[str] = (),
) -> Section | None:
    """The mapping at `path` if it is one; unknown keys and missing required ones are errors."""
    if not isinstance(value, dict):
        issues.error(
            path or SPEC_KEY,
            f"expected a mapping, got {kind(value)} {show(value)}",
            f"write a mapping with keys {listing(examples)}",
        )
        return None
    known: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            issues.error(at(path, keyname(key)), f"key {show(key)} is not a string", "quote it")
        elif key not in examples:
            issues.error(
                at(path, keyname(key)),
                f"unknown key {show(key)}{did_you_mean(key, examples)}",
                f"remove it, or use one of {listing(examples)}",
            )
        else:
            known[key] = item
    for key in required:
        if key not in value:
            issues.error(at(path, key), "required key is missing", f"add {examples[key]}")
    return Section(issues, known, path, examples)


def subsection(
    parent: Section, key: str, examples: Mapping[str, str], required: Sequence[str] = ()
) -> Section | None:
    """An optional nested mapping; absent or null means not set."""
    value = parent.data.get(key)
    if value is None:
        return None
    return section(parent.issues, value, parent.where(key), examples, required)


def entries(parent: Section, key: str, most: int) -> list[object]:
    """The list at `key`; null means empty, as YAML writes a list whose entries were removed.

    More than `most` entries is an error, and none is read: rules between entries compare
    pairs, and a site has far fewer, so the bound keeps validation within a second.
    """
    value = parent.data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        parent.bad(key, value, "a list")
        return []
    if len(value) > most:
        parent.issues.error(
            parent.where(key),
            f"has {len(value)} entries, more than the {most} a site spec may list",
            f"list at most {most}: a site's {key} are far fewer (is this the right file?)",
        )
        return []
    return value
