"""Finding and reading the site spec: a YAML file or an Ansible inventory directory.

Input is untrusted and bounded: at most MAX_BYTES are read (so `validate /dev/zero` or a 50 MB
file is refused at once), UTF-8 only (a Latin-1 or UTF-16 file is named as such, with the line),
and at most MAX_NODES YAML nodes once aliases are expanded (so an alias bomb is refused before it
is built). YAML is parsed safely; a key written twice is refused, merge keys (<<: *defaults) are
accepted; templated (Jinja) values are refused, since the doctor reads the spec outside Ansible.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, NoReturn

import yaml

from ct200_tools.spec.model import DEFAULT_SPEC_PATH, SPEC_KEY, SiteSpec, SpecError, SpecIssue
from ct200_tools.spec.read import at, keyname, listing, show
from ct200_tools.spec.schema import ROOT, validate
from ct200_tools.untrusted import UntrustedInputError, read_bounded

#: The most bytes read from one spec file. The example site is 4 KiB; a file this size parses
#: in well under a second, a larger one is not a spec.
MAX_BYTES: Final = 256 << 10
#: The most YAML nodes a spec may have with every alias expanded (the example has about 250).
MAX_NODES: Final = 50_000
#: How many MAX_BYTES chunks of an unrelated group_vars file are scanned for ct200_site (64 MiB).
SCAN_CHUNKS: Final = 256
#: The environment variable both CLIs read when --spec is not given.
SPEC_ENV: Final = "CT200_SPEC"

Origin = Literal["--spec", "CT200_SPEC", "default", "none"]


def fail(source: str, message: str, fix: str) -> NoReturn:
    raise SpecError([SpecIssue(SPEC_KEY, message, fix)], source)


# --- which spec -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecChoice:
    """Which spec a command uses, and why: the one resolver of both CLIs."""

    path: str | None
    origin: Origin

    def describe(self) -> str:
        """For messages: the path, where it came from unless given, or why there is none."""
        if self.path is None:
            return (
                f"no site spec: no --spec, {SPEC_ENV} is not set, and {DEFAULT_SPEC_PATH} "
                "does not exist"
            )
        how = {"CT200_SPEC": f" (from ${SPEC_ENV})", "default": " (the default)"}
        return f"{self.path}{how.get(self.origin, '')}"


def find_spec(explicit: str | None, environ: Mapping[str, str] = os.environ) -> SpecChoice:
    """--spec if given, else $CT200_SPEC if set, else /etc/ct200/site.yml if it exists, else none.

    A path given on purpose (--spec or CT200_SPEC) is used even if it is missing, so loading it
    says so; only the default is optional.
    """
    if explicit is not None:
        return SpecChoice(explicit, "--spec")
    if environ.get(SPEC_ENV):
        return SpecChoice(environ[SPEC_ENV], "CT200_SPEC")
    if Path(DEFAULT_SPEC_PATH).exists():
        return SpecChoice(DEFAULT_SPEC_PATH, "default")
    return SpecChoice(None, "none")


# --- bytes and text ---------------------------------------------------------------------------


def read_text(file: Path) -> str:
    """The file's text: at most MAX_BYTES, UTF-8 (a UTF-8 BOM is allowed). Read as a file from
    outside (untrusted.read_bounded): a FIFO, a socket or a device is refused, never waited on."""
    try:
        data = read_bounded(file, "the site spec", MAX_BYTES, "")
    except UntrustedInputError as exc:
        if exc.problem == "missing":
            fail(
                str(file),
                "no such file",
                "pass a site YAML file or an Ansible inventory directory; the playbooks write "
                f"{DEFAULT_SPEC_PATH} on every target",
            )
        if exc.problem == "too-large":
            fail(
                str(file),
                f"is larger than {MAX_BYTES >> 10} KiB, the most a site spec may be",
                "pass the site spec itself (a few KiB of YAML) or its inventory directory, not "
                "another file",
            )
        if exc.problem == "not-regular":
            fail(
                str(file),
                exc.reason,
                "pass a site YAML file or an Ansible inventory directory (a copy of the spec, "
                "not a pipe or a device)",
            )
        fail(str(file), exc.reason, "check the path and its permissions")
    return decode(data, str(file))


def decode(data: bytes, source: str) -> str:
    """UTF-8 text, or SpecError naming the encoding found and where the first bad byte is."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or (data[:2].count(0) == 1):
        fail(
            source,
            "is UTF-16 (a byte order mark or NUL bytes at the start), not UTF-8",
            f"convert it: iconv -f UTF-16 -t UTF-8 {source} > site.utf8.yml, and pass that",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start]
        fail(
            source,
            f"is not UTF-8: byte 0x{byte:02x} at line {line}, column {column} (byte offset "
            f"{exc.start}); the file looks Latin-1 or another 8-bit encoding",
            f"convert it: iconv -f LATIN1 -t UTF-8 {source} > site.utf8.yml (if it is Latin-1), "
            "or retype the character there",
        )


# --- YAML -------------------------------------------------------------------------------------

MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecLoader(_Base):  # type: ignore[valid-type,misc]
    """safe_load that refuses a key written twice (PyYAML would keep the last one silently, so a
    second `port:` would quietly win) and counts nodes before building anything."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        # Only the keys written in this mapping: merged ones (<<: *defaults) are overridden by
        # an explicit key, as YAML says, and repeat nothing.
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        result: dict[object, object] = super().construct_mapping(node, deep=deep)
        return result


def expanded_nodes(root: yaml.Node, limit: int) -> int | None:
    """How many nodes the document has with every alias expanded, or None above limit or when
    an alias contains itself. Linear in the distinct nodes (aliases share a node object)."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > limit:
                return None
            continue
        if key in size:
            continue
        if key in on_path:
            return None  # recursive: infinite when expanded
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def parse_yaml(text: str, source: str) -> object:
    loader = SpecLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if expanded_nodes(root, MAX_NODES) is None:
            fail(
                source,
                f"has more than {MAX_NODES} YAML values once aliases are expanded, or an alias "
                "that contains itself (an alias bomb, or not a site spec)",
                "a site spec has a few hundred values: check the file, and share server "
                "settings with one level of merge keys (<<: *defaults), not nested aliases",
            )
        return loader.construct_document(root)
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
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (NUL, C1 controls)
        line, column = _line_column(text, exc.position)
        fail(
            source,
            f"YAML error at line {line}, column {column}: {exc.reason} ({_char(exc.character)})",
            "remove the character there: YAML takes no control characters except tab and newline",
        )
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML lets int() errors out (a number of thousands of digits) and recurses per level.
        fail(source, f"YAML error: {show(str(exc))}", "fix the YAML")
    finally:
        loader.dispose()


def _line_column(text: str, position: int) -> tuple[int, int]:
    # libyaml counts bytes of the UTF-8 text, PyYAML's own reader characters.
    data = text.encode()
    if _Base is yaml.SafeLoader:
        position = len(text[:position].encode())
    line_start = data.rfind(b"\n", 0, position) + 1
    return data.count(b"\n", 0, position) + 1, position - line_start + 1


def _char(character: object) -> str:
    return f"0x{character:02x}" if isinstance(character, int) else repr(character)


# --- files and inventories --------------------------------------------------------------------


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
        if file.stat().st_size > MAX_BYTES and not mentions(file, SPEC_KEY):
            continue  # other large group_vars (a CA bundle, say) are none of ours
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


def mentions(file: Path, word: str) -> bool:
    """Whether the file holds `word`, read a chunk at a time; a file too large even to scan
    counts as holding it, so that reading it is refused with its name."""
    needle, tail = word.encode(), b""
    try:
        with file.open("rb") as fh:
            for _ in range(SCAN_CHUNKS):
                chunk = fh.read(MAX_BYTES)
                if not chunk:
                    return False
                if needle in tail + chunk:
                    return True
                tail = chunk[-len(needle) :]
    except OSError:
        return True  # read_text says what is wrong
    return True


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
    if id(value) in seen:  # an alias: its values were looked at where it was anchored
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        return [i for k, v in value.items() for i in templated(v, at(path, keyname(k)), seen)]
    if isinstance(value, list):
        return [i for n, v in enumerate(value) for i in templated(v, at(path, n), seen)]
    return []


def load_spec(path: str | os.PathLike[str]) -> SiteSpec:
    """The spec from a YAML file with a top-level ct200_site, or from an inventory directory.

    In a directory exactly one group_vars/**/*.yml|yaml file must define ct200_site. Raises
    SpecError for unreadable, oversized or non-UTF-8 files, YAML errors (with line and column),
    alias bombs, Jinja in values, and everything validate() finds.
    """
    if not str(path).strip():  # Path("") is the current directory
        fail("", "the spec path is empty", "give the path of a site YAML file or inventory")
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
