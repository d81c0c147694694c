"""A stand-in for how pve-container reads a container config at the next start, written for the
tests from its Perl source (not from ct200_tools/host/pvecfg.py, whose result it judges), because
pve-container itself (Perl, pmxcfs) cannot run here:

* PVE/LXC/Config.pm ``parse_pct_config``: lines split at "\\n"; blank lines skipped; a
  ``[pve:pending]`` header (case-insensitive) starts the pending section afresh, another
  ``[name]`` header a snapshot; ``#`` lines are the description; ``lxc.*`` lines are pushed
  onto a list; ``delete:`` is allowed only in the pending section; any other ``key: value``
  sets the key (the last line of a key wins).
* PVE/LXC.pm ``vm_start`` -> Config.pm ``vmconfig_apply_pending``: every key of the pending
  ``delete:`` list (pve-guest-common AbstractConfig ``parse_pending_delete``: split at ``,``,
  ``;`` and blanks, a leading ``!`` = forced) is deleted from the main section, then every
  pending key (``lxc``, the raw lines' list, too) replaces the main one.
* Config.pm ``parse_device`` (PVE::JSONSchema ``parse_property_string`` with ``$dev_desc``):
  comma-separated, a part without ``=`` is the path, keys path, mode (``0[0-7]{3}``), uid,
  gid (integers >= 0) and deny-write (boolean); anything else, a key given twice or a
  missing path fails the container's start.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field


class PveRefuses(Exception):
    """What would make pve-container die at parse or start."""


@dataclass
class Section:
    keys: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] | None = None


@dataclass
class Parsed:
    main: Section
    pending: Section
    snapshots: dict[str, Section]


def parse_pct_config(text: str) -> Parsed:
    main = Section()
    pending = Section()
    snapshots: dict[str, Section] = {}
    conf = main
    section = ""
    for line in text.split("\n"):
        if re.match(r"^\s*$", line):
            continue
        if re.match(r"^\[pve:pending\]\s*$", line, re.IGNORECASE):
            section = "pending"
            conf = pending = Section()
            continue
        m = re.match(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", line, re.IGNORECASE)
        if m:
            section = m.group(1)
            conf = snapshots[section] = Section()
            continue
        if line.startswith("#"):
            continue
        m = re.match(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$", line)
        if m:
            conf.lxc = [*(conf.lxc or []), (m.group(1), m.group(3))]
            continue
        if re.match(r"^(description):\s*(.*\S)\s*$", line):
            continue
        m = re.match(r"^delete:\s*(.*\S)\s*$", line)
        if m:
            if section != "pending":
                raise PveRefuses("property 'delete' is only allowed in [pve:pending]")
            conf.keys["delete"] = m.group(1)
            continue
        m = re.match(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", line)
        if m:
            if "\r" in m.group(2) or "\n" in m.group(2):
                raise PveRefuses(f"{m.group(1)}: property contains a line feed")
            conf.keys[m.group(1)] = m.group(2)
            continue
        raise PveRefuses(f"unable to parse config: {line!r}")
    return Parsed(main, pending, snapshots)


def parse_pending_delete(data: str | None) -> list[str]:
    if not data:
        return []
    return [entry.lstrip("!") for entry in re.sub(r"[,;]", " ", data).split()]


def at_next_start(text: str) -> Section:
    """The main section as the container starts with it: pending applied."""
    parsed = parse_pct_config(text)
    conf = Section(dict(parsed.main.keys), parsed.main.lxc)
    pending = parsed.pending
    for opt in sorted(set(parse_pending_delete(pending.keys.get("delete")))):
        if opt == "lxc":
            conf.lxc = None
        conf.keys.pop(opt, None)
    for opt, value in sorted(pending.keys.items()):
        if opt != "delete":
            conf.keys[opt] = value
    if pending.lxc is not None:
        conf.lxc = pending.lxc
    return conf


DEV_KEYS = {"path", "mode", "uid", "gid", "deny-write"}


def parse_device(value: str) -> dict[str, str]:
    res: dict[str, str] = {}
    for part in value.split(","):
        if re.match(r"^\s*$", part):
            continue
        m = re.match(r"^([^=]+)=(.+)$", part)
        if m:
            key, val = m.group(1), m.group(2)
        elif "=" not in part:
            key, val = "path", part
        else:
            raise PveRefuses(f"missing key in {value!r}")
        if key in res:
            raise PveRefuses(f"duplicate key {key} in {value!r}")
        if key not in DEV_KEYS:
            raise PveRefuses(f"invalid key {key} in {value!r}")
        res[key] = val
    _check_schema(value, res)
    return res


def _check_schema(value: str, res: dict[str, str]) -> None:
    """$dev_desc's formats: pve-lxc-dev-string, mode's pattern, integers, a boolean."""
    if "path" not in res:
        raise PveRefuses(f"Path has to be defined: {value!r}")
    if not re.fullmatch(r"/dev/.*", res["path"]) or re.search(r"/\.\.?(?:/|$)", res["path"]):
        raise PveRefuses(f"{res['path']} is not a valid device path")
    if "mode" in res and not re.fullmatch(r"0[0-7]{3}", res["mode"]):
        raise PveRefuses(f"mode {res['mode']!r} does not match 0[0-7]{{3}}")
    for key in ("uid", "gid"):
        if key in res and not re.fullmatch(r"\d+", res[key]):
            raise PveRefuses(f"{key} {res[key]!r} is not an integer >= 0")
    if "deny-write" in res and res["deny-write"].lower() not in {
        "1", "on", "yes", "true", "0", "off", "no", "false",
    }:  # fmt: skip
        raise PveRefuses(f"deny-write {res['deny-write']!r} is not a boolean")


def _path_of(value: str) -> str:
    for part in value.split(","):
        if "=" not in part:
            return part
        if part.startswith("path="):
            return part[5:]
    return ""


def devices(conf: Section, nodes: set[str] | None = None) -> dict[str, dict[str, str]]:
    """devN key -> its parsed entry, for every devN of the started container (only those of
    ``nodes`` when given: another entry PVE refuses is not the module's to judge)."""
    return {
        k: parse_device(v)
        for k, v in conf.keys.items()
        if re.fullmatch(r"dev\d+", k) and (nodes is None or _path_of(v) in nodes)
    }


def node_counts(conf: Section, nodes: set[str] | None = None) -> Counter[str]:
    """How many times the start creates each node: a devN entry or a bind mount each."""
    count = Counter(d["path"] for d in devices(conf, nodes).values())
    for key, value in conf.lxc or []:
        if key == "lxc.mount.entry" and value.split():
            count[value.split()[0]] += 1
    return count
