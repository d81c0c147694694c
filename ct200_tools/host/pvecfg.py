"""Proxmox VE container configs (/etc/pve/lxc/<vmid>.conf): parse, edit the GPU passthrough
lines, write the way PVE itself does.

Stdlib only and Python 3.9+: this same file runs on the PVE host as the Ansible module's
module_utils (plugins/module_utils/ct200_pvecfg.py is a link to it), and PVE 7 ships 3.9. One
file on purpose, parser and editor and writer together: Ansible ships it to the host as one.

What it keeps (../shared/domain.md section 3):

* The edit is judged as PVE will start the container: ``[pve:pending]`` applied first
  (vmconfig_apply_pending). Like `pct set`, an index it writes leaves the pending ``delete:``
  list, and a pending devN for a managed node is set in main rather than left to create the
  node twice; that is the only edit outside the main section. ``[snapshot]`` sections are kept
  byte for byte (appending at EOF would land in a snapshot).
* Every other line stays as it was, in its place: comments, unknown keys, odd spacing, bytes
  that are not UTF-8, line ends (CRLF too). Lines are classified the way pve-container's
  parse_pct_config does. A managed devN keeps the admin's uid/gid and gets a mode PVE accepts.
* The lines it owns (devN entries for the managed nodes, lxc.mount.entry for them, device
  allow rules for the NVIDIA majors and for stale dynamic majors) are replaced in place,
  never duplicated; a new line goes next to its kind.
* Two boot keys can be set too (``onboot``, ``startup``: whether and in what order PVE starts the
  container at host boot), replaced where they stand or inserted among the keys in PVE's
  alphabetical order; they need no container restart (``Plan.passthrough_changed``).
* Reads a regular file only, never through a symlink (PVE's /etc/pve/lxc holds none; writing
  would replace the link and leave its target stale). Writes like
  PVE::Tools::file_set_contents: ``<file>.tmp.<pid>`` in the same directory, created with the
  file's own mode (no chmod, no chown: pmxcfs refuses both), renamed over the config; while
  holding pve-container's config lock (flock on /run/lock/lxc/pve-config-<vmid>.lock), so
  `pct set` or the web UI cannot interleave.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

LOCK_DIR = "/run/lock/lxc"
#: pve-container waits this long for its config lock (PVE::AbstractConfig::lock_config).
LOCK_TIMEOUT = 10.0
#: pve-container's limit: dev0 .. dev255.
MAX_DEV = 256
#: The mount options raw-lxc passthrough gives each node (create the file, skip a missing node).
MOUNT_OPTIONS = "none bind,optional,create=file"
ALLOW_KEY = "lxc.cgroup2.devices.allow"
#: The cgroup v1 key: ignored on PVE 7+ (cgroup v2), replaced by ALLOW_KEY when it is ours.
ALLOW_KEY_V1 = "lxc.cgroup.devices.allow"
MOUNT_KEY = "lxc.mount.entry"
PASSTHROUGH = ("devn", "raw-lxc")
#: Main-section keys besides the passthrough lines that Want.options may set.
BOOT_KEYS = ("onboot", "startup")
#: pve-container's startup format: [[order=]N][,up=N][,down=N].
_STARTUP = re.compile(r"^(?:(?:order=)?\d+)?(?:(?:^|,)(?:up|down)=\d+)*$")

# pve-container's parse_pct_config, line by line (PVE/LXC/Config.pm).
_PENDING = re.compile(r"^\[pve:pending\]\s*$", re.IGNORECASE)
_SECTION = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.IGNORECASE)
_BLANK = re.compile(r"^\s*$")
_LXC = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
_DESCRIPTION = re.compile(r"^(description):\s*(.*\S)\s*$")
_KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")
_DEV = re.compile(r"^dev(\d+)$")
_ALLOW = re.compile(r"^([abc])\s+(\*|\d+):(\*|\d+)\s+([rwm]+)$")

#: Linux hands out dynamic char majors from these ranges (fs/char_dev.c); an allow rule for one
#: that no driver holds now is a leftover, like the incident's rule for an old nvidia-uvm major.
DYNAMIC_MAJORS = (range(234, 255), range(384, 512))

#: Node families by /proc/devices name, as the doctor maps them
#: (ct200_tools/doctor/checks/devices.py).
NODE_PATTERNS = (
    (re.compile(r"^/dev/nvidia(\d+|ctl|-modeset)$"), "nvidia"),
    (re.compile(r"^/dev/nvidia-uvm(-tools)?$"), "nvidia-uvm"),
    (re.compile(r"^/dev/nvidia-caps/nvidia-cap\d+$"), "nvidia-caps"),
    (re.compile(r"^/dev/nvidia-nvswitch(\d+|ctl)$"), "nvidia-nvswitch"),
    (re.compile(r"^/dev/nvidia-nvlink$"), "nvidia-nvlink"),
)
#: /proc/devices names of the nvidia (195) major, by driver generation.
NVIDIA_NAMES = ("nvidia", "nvidia-frontend", "nvidiactl")


class PveConfigError(Exception):
    """Bad input: the message says what and how to fix it; nothing was written."""


class LockTimeout(PveConfigError):
    pass


@dataclass(frozen=True)
class Line:
    """One line of the main section, without its newline, classified as PVE would."""

    text: str
    kind: str  # blank | comment | lxc | key | unparsed
    key: str = ""
    value: str = ""

    @functools.cached_property
    def dev_index(self) -> int | None:
        m = _DEV.match(self.key) if self.kind == "key" else None
        return int(m.group(1)) if m else None


def classify(text: str) -> Line:
    if _BLANK.match(text):
        return Line(text, "blank")
    if text.startswith("#"):
        return Line(text, "comment")
    m = _LXC.match(text)
    if m:
        return Line(text, "lxc", m.group(1), m.group(3))
    m = _DESCRIPTION.match(text) or _KEY.match(text)
    if m:
        return Line(text, "key", m.group(1), m.group(2))
    return Line(text, "unparsed")


def as_pve_reads(text: str) -> str:
    """A key line as `pct config` prints it: ``key: value``, with PVE's separator and spacing."""
    line = classify(text)
    return f"{line.key}: {line.value}" if line.kind in ("key", "lxc") else text


def is_section_header(text: str) -> bool:
    return bool(_PENDING.match(text) or _SECTION.match(text))


@dataclass(frozen=True)
class Config:
    """A parsed config: the main section's lines, and the rest of the file untouched."""

    lines: tuple[Line, ...]
    #: Whether the main section's last line ends with a newline.
    final_newline: bool
    #: Everything from the first section header on, byte for byte ("" when there is none).
    rest: str

    def render(self) -> str:
        main = "\n".join(line.text for line in self.lines)
        if self.lines and (self.final_newline or self.rest):
            main += "\n"
        return main + self.rest

    def main_value(self, key: str) -> str | None:
        return next((ln.value for ln in self.lines if ln.kind == "key" and ln.key == key), None)

    def unparsed(self) -> list[tuple[int, str]]:
        """(line number, text) of main-section lines PVE itself would not understand."""
        return [(i + 1, ln.text) for i, ln in enumerate(self.lines) if ln.kind == "unparsed"]

    def pending_dev_indexes(self) -> set[int]:
        """devN indexes a pending change would add: a new entry must not take them."""
        out: set[int] = set()
        pending = False
        for text in self.rest.split("\n"):
            if _PENDING.match(text) or _SECTION.match(text):
                pending = bool(_PENDING.match(text))
                continue
            line = classify(text)
            if pending and line.dev_index is not None:
                out.add(line.dev_index)
        return out


def parse(text: str) -> Config:
    """Never fails and never drops a byte: ``parse(t).render() == t`` for every string t."""
    offset = 0
    while offset < len(text):
        end = text.find("\n", offset)
        end = len(text) if end < 0 else end
        if is_section_header(text[offset:end]):
            break
        offset = end + 1
    main, rest = text[:offset], text[offset:]
    if offset > len(text):  # the last line had no newline and no header followed
        main, rest = text, ""
    final_newline = main.endswith("\n")
    body = main[:-1] if final_newline else main
    lines = tuple(classify(t) for t in body.split("\n")) if main else ()
    return Config(lines, final_newline, rest)


# --- the [pve:pending] section ---------------------------------------------------------------


def _split_keep(text: str) -> list[str]:
    """Lines with their own "\\n" (str.splitlines would also split at \\r, \\f and others)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _delete_keys(value: str) -> dict[str, bool]:
    """A pending ``delete:`` value as PVE reads it (AbstractConfig parse_pending_delete): keys
    split at commas, semicolons and blanks, ``!`` marking a forced deletion."""
    keys: dict[str, bool] = {}
    for entry in re.sub(r"[,;]", " ", value).split():
        keys[entry.lstrip("!")] = entry.startswith("!")
    return keys


def _print_delete(keys: dict[str, bool]) -> str:
    """AbstractConfig print_pending_delete: sorted, comma separated."""
    return ",".join(f"{'!' if force else ''}{k}" for k, force in sorted(keys.items()))


@dataclass(frozen=True)
class Pending:
    """The ``[pve:pending]`` section as pve-container reads it (parse_pct_config: the last line
    of a key wins). Indexes count the lines of ``Config.rest``."""

    #: key -> (value PVE uses, indexes of every line of that key).
    keys: dict[str, tuple[str, tuple[int, ...]]]
    #: The ``delete:`` line PVE uses (the last one), or None.
    delete_at: int | None
    delete: dict[str, bool]
    #: Indexes of the raw ``lxc.*`` lines: at the next start they replace all of main's.
    lxc_at: tuple[int, ...]

    def dev_values(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for key, (value, _) in self.keys.items():
            m = _DEV.match(key)
            if m:
                out[int(m.group(1))] = value
        return out


def pending_of(config: Config) -> Pending:
    """The pending section of ``config`` (empty when it has none). A second ``[pve:pending]``
    header starts it afresh: PVE drops what the first one held."""
    keys: dict[str, tuple[str, tuple[int, ...]]] = {}
    delete_at: int | None = None
    delete: dict[str, bool] = {}
    lxc_at: list[int] = []
    pending = False
    for i, raw in enumerate(_split_keep(config.rest)):
        text = raw.rstrip("\n")
        if is_section_header(text):
            pending = bool(_PENDING.match(text))
            if pending:
                keys, delete_at, delete, lxc_at = {}, None, {}, []
            continue
        line = classify(text)
        if not pending:
            continue
        if line.kind == "lxc":
            lxc_at.append(i)
        elif line.kind == "key" and line.key == "delete":
            delete_at, delete = i, _delete_keys(line.value)
        elif line.kind == "key":
            keys[line.key] = (line.value, (*keys.get(line.key, ("", ()))[1], i))
    return Pending(keys, delete_at, delete, tuple(lxc_at))


# --- /proc/devices ---------------------------------------------------------------------------


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character-device majors by driver name (the first major a name has)."""
    majors: dict[str, int] = {}
    in_char = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            in_char = line == "Character devices:"
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


#: /proc/devices is a few KiB; a file larger than this is not it.
MAX_PROC_DEVICES_BYTES = 256 * 1024


def read_proc_devices(path: str) -> dict[str, int]:
    try:
        data = _read_regular(path, MAX_PROC_DEVICES_BYTES, "/proc/devices", follow=True)
    except OSError as exc:
        raise PveConfigError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_PROC_DEVICES_BYTES:
        raise PveConfigError(
            f"{path} is larger than {MAX_PROC_DEVICES_BYTES} bytes: not /proc/devices"
        )
    return parse_proc_devices(data.decode("utf-8", "replace"))


def driver_of(path: str) -> str | None:
    """The /proc/devices name whose major a node has, or None for a node we do not pass."""
    return next((name for pattern, name in NODE_PATTERNS if pattern.match(path)), None)


def major_of(driver: str, majors: dict[str, int]) -> int | None:
    names = NVIDIA_NAMES if driver == "nvidia" else (driver,)
    return next((majors[n] for n in names if n in majors), None)


def is_dynamic(major: int) -> bool:
    return any(major in r for r in DYNAMIC_MAJORS)


# --- the GPU passthrough lines ---------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    """What the managed lines should be.

    ``devices``: host node paths (e.g. /dev/nvidia0, /dev/nvidia-uvm); ``passthrough``: devn
    (``devN: <path>,mode=<mode>``) or raw-lxc (allow rules for the majors in ``majors`` plus one
    bind mount per node); ``majors``: /proc/devices, required for raw-lxc.
    """

    devices: tuple[str, ...]
    passthrough: str = "devn"
    mode: str = "0666"
    majors: dict[str, int] | None = None
    #: Boot keys to set, (key, value) pairs of BOOT_KEYS: ("onboot", "1"), ("startup", "order=1").
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Item:
    kind: str  # dev | allow | mount
    ident: str  # dev, mount: the node path; allow: the major, or "stale"
    key: str
    value: str


@dataclass(frozen=True)
class Plan:
    before: str
    after: str
    #: The managed lines after the edit, in file order.
    managed: tuple[str, ...]
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: (old line, new line) for each line changed in place (a stale major's allow rule).
    replaced: tuple[tuple[str, str], ...] = ()
    #: Whether the main section's passthrough lines changed (the container needs a restart); a
    #: changed boot key or a pending-only edit alone needs none.
    passthrough_changed: bool = False
    #: Lines of the [pve:pending] section taken out or rewritten: a pending devN for a managed
    #: node (now set in main), a ``delete:`` that named an index the module writes.
    pending_removed: tuple[str, ...] = ()
    #: The line that replaces such a ``delete:`` (the other keys it deletes), if any.
    pending_added: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.before != self.after


def validate(want: Want) -> None:
    if want.passthrough not in PASSTHROUGH:
        raise PveConfigError(
            f"passthrough must be one of {', '.join(PASSTHROUGH)}, not {want.passthrough!r}"
        )
    if not want.devices:
        raise PveConfigError("devices is empty: list the host nodes to pass, e.g. /dev/nvidia0")
    unknown = [d for d in want.devices if driver_of(d) is None]
    if unknown:
        raise PveConfigError(
            f"cannot map device path(s) {', '.join(unknown)} to an NVIDIA driver: "
            "ct200_pve_lxc_gpu passes /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-modeset, "
            "/dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-caps/nvidia-capN, "
            "/dev/nvidia-nvswitchN and /dev/nvidia-nvlink; fix the list"
        )
    if not re.fullmatch(r"0?[0-7]{3}", want.mode):
        raise PveConfigError(f"mode must be an octal access mode like 0666, not {want.mode!r}")
    for key, value in want.options:
        if key not in BOOT_KEYS:
            raise PveConfigError(f"cannot set {key!r}: only {', '.join(BOOT_KEYS)} are managed")
        if key == "onboot" and value not in ("0", "1"):
            raise PveConfigError(f"onboot must be 0 or 1, not {value!r}")
        if key == "startup" and (not value or not _STARTUP.match(value)):
            raise PveConfigError(
                f"startup {value!r} is not PVE's format [order=]N[,up=N][,down=N]: "
                "fix it, e.g. order=1 or order=1,up=30"
            )


def _wanted(want: Want) -> list[_Item]:
    devices = list(dict.fromkeys(want.devices))
    if want.passthrough == "devn":
        mode = want.mode.rjust(4, "0")
        return [_Item("dev", d, "dev", f"{d},mode={mode}") for d in devices]
    majors = want.majors or {}
    items: list[_Item] = []
    for d in devices:
        drv = driver_of(d) or ""
        major = major_of(drv, majors)
        if major is None:
            hint = (
                "modprobe nvidia_uvm && nvidia-modprobe -u -c0"
                if drv == "nvidia-uvm"
                else f"load the driver that registers {drv}"
            )
            raise PveConfigError(
                f"{drv} is not in /proc/devices, so the major of {d} is unknown: raw-lxc mode "
                f"writes the major the host has now, so load the module first ({hint}; "
                "playbooks/host.yml --tags host_devices does it, and at every boot), then re-run"
            )
        rule = f"c {major}:* rwm"
        if not any(i.kind == "allow" and i.ident == str(major) for i in items):
            items.append(_Item("allow", str(major), ALLOW_KEY, rule))
    items += [_Item("mount", d, MOUNT_KEY, f"{d} {d[1:]} {MOUNT_OPTIONS}") for d in devices]
    return items


def _dev_opts(value: str) -> dict[str, str]:
    """A devN entry's options; its path with repeated slashes collapsed, since PVE stats and
    creates /dev//nvidia0 as /dev/nvidia0 (the same node, twice, if it counted as another)."""
    opts: dict[str, str] = {}
    for part in value.split(","):
        k, eq, v = part.partition("=")
        if eq:
            opts[k.strip()] = v.strip()
        elif part.strip():
            opts["path"] = part.strip()
    if "path" in opts:
        opts["path"] = re.sub("/+", "/", opts["path"])
    return opts


def _owned(line: Line, want: Want, ours: set[int], live: set[int] | None) -> _Item | None:
    """The managed item a line stands for, or None for a line that is not ours: a devN entry
    or bind mount of a managed node, an allow rule for a major of the managed nodes (``ours``),
    or a whole-major allow rule for a dynamic major no driver holds (``live``: every major in
    /proc/devices; None when it was not read)."""
    paths = set(want.devices)
    if line.dev_index is not None:
        path = _dev_opts(line.value).get("path", "")
        return _Item("dev", path, line.key, line.value) if path in paths else None
    if line.kind != "lxc":
        return None
    if line.key == MOUNT_KEY:
        source = line.value.split()[0] if line.value.split() else ""
        return _Item("mount", source, line.key, line.value) if source in paths else None
    if line.key not in (ALLOW_KEY, ALLOW_KEY_V1):
        return None
    m = _ALLOW.match(" ".join(line.value.split()))
    if not m or m.group(1) != "c" or m.group(2) == "*":
        return None
    major = int(m.group(2))
    if major in ours:
        return _Item("allow", str(major), line.key, line.value)
    if live is not None and m.group(3) == "*" and is_dynamic(major) and major not in live:
        return _Item("allow", "stale", line.key, line.value)
    return None


# --- what the doctor reads of a config (checks/lxc.py) ----------------------------------------


def passed_nodes(config: Config) -> dict[str, str]:
    """Host node path -> the main-section line that passes it (a devN entry or a bind mount)."""
    out: dict[str, str] = {}
    for line in config.lines:
        if line.dev_index is not None:
            path = _dev_opts(line.value).get("path", "")
        elif line.kind == "lxc" and line.key == MOUNT_KEY and line.value.split():
            path = line.value.split()[0]
        else:
            continue
        if path:
            out.setdefault(path, line.text)
    return out


@dataclass(frozen=True)
class AllowRule:
    line: str
    #: "a" (all devices), "b" or "c".
    type: str
    #: None for "*".
    major: int | None
    minor: int | None


def allow_rules(config: Config) -> list[AllowRule]:
    """The main section's device allow rules that parse (cgroup v2 key and the v1 one)."""
    out = []
    for line in config.lines:
        if line.kind != "lxc" or line.key not in (ALLOW_KEY, ALLOW_KEY_V1):
            continue
        value = " ".join(line.value.split())
        if value == "a":
            out.append(AllowRule(line.text, "a", None, None))
            continue
        m = _ALLOW.match(value)
        if m:
            major = None if m.group(2) == "*" else int(m.group(2))
            minor = None if m.group(3) == "*" else int(m.group(3))
            out.append(AllowRule(line.text, m.group(1), major, minor))
    return out


def allows(rules: list[AllowRule], major: int) -> bool:
    """Whether the rules let the container use char major ``major`` (every minor of it, or some)."""
    return any(r.type == "a" or (r.type == "c" and r.major in (None, major)) for r in rules)


def is_stale(rule: AllowRule, live: set[int]) -> bool:
    """A whole-major char rule for a dynamic major no driver holds now: the rule ``plan``
    replaces (raw-lxc) or deletes (devn), like the incident's rule for an old nvidia-uvm major."""
    return (
        rule.type == "c"
        and rule.major is not None
        and rule.minor is None
        and is_dynamic(rule.major)
        and rule.major not in live
    )


def _same(item: _Item, line: Line) -> bool:
    """Whether a raw lxc line (allow rule, bind mount) already means what ``item`` wants."""
    if line.key != item.key:
        return False
    if item.kind == "allow":
        got = _ALLOW.match(" ".join(line.value.split()))
        if got is None:
            return False
        return (got.group(1), got.group(2), got.group(3), set(got.group(4))) == (
            "c",
            item.ident,
            "*",
            set("rwm"),
        )
    return line.value.split() == item.value.split()


#: The options of a devN entry (pve-container's $dev_desc); PVE refuses any other.
DEV_KEYS = ("path", "mode", "uid", "gid", "deny-write")
_TRUE = ("1", "on", "yes", "true")
_FALSE = ("0", "off", "no", "false")


def _dev_problem(part: str, k: str, v: str, seen: set[str]) -> str:
    """Why PVE's parse_property_string (with $dev_desc) refuses one option, or ""."""
    if not k or not v:
        return f"{part!r} has no option name or no value"
    if k in seen:
        return f"{k} is given twice"
    if k not in DEV_KEYS:
        return f"unknown option {k!r}; a devN entry takes {', '.join(DEV_KEYS)}"
    if k in ("uid", "gid") and not re.fullmatch(r"\d+", v):
        return f"{k} must be a number >= 0, not {v!r}"
    if k == "deny-write" and v.lower() not in _TRUE + _FALSE:
        return f"deny-write must be 0 or 1, not {v!r}"
    return ""


def _dev_value(key: str, value: str, mode: str) -> str:
    """The value a managed devN entry gets: its path and the admin's own options (uid, gid) as
    written, the access mode set to ``mode`` (PVE's schema wants ``0[0-7]{3}``: ``666`` stops
    the container at its start). Parsed the way PVE parses it: an entry PVE refuses would stop
    the start too, so it is refused here, before any change, naming what to fix.
    ``deny-write=1`` goes: CUDA opens nvidiactl and nvidia-uvm read-write, and a write the
    cgroup denies is the incident's EPERM (cuInit 999)."""
    parts: list[str] = []
    seen: set[str] = set()
    mode_at = None
    path_at = 0
    for part in value.split(","):
        if not part.strip():
            continue  # PVE skips an empty part
        k, eq, v = part.partition("=")
        if not eq:
            k, v = "path", part
        why = _dev_problem(part, k, v, seen)
        if why:
            raise PveConfigError(
                f"{key}: {value!r} passes a node this module manages, and PVE refuses it "
                f"({why}), so the container would not start: fix or remove that option, then "
                "run again"
            )
        seen.add(k)
        if k == "mode":
            mode_at = len(parts)
        elif k == "path":
            path_at = len(parts)
        elif k == "deny-write" and v.lower() in _TRUE:
            continue
        parts.append(part)
    if mode_at is None:
        parts.insert(path_at + 1, f"mode={mode}")
    else:
        parts[mode_at] = f"mode={mode}"
    return ",".join(parts)


def _match(
    owned: dict[int, _Item], items: list[_Item], prefer: set[int]
) -> tuple[dict[int, _Item], list[_Item]]:
    """Which owned line (by index) each wanted item takes over, ``prefer`` first, then in file
    order; the items no line takes."""
    placed: dict[int, _Item] = {}
    unplaced: list[_Item] = []
    order = sorted(owned, key=lambda i: (i not in prefer, i))
    for item in items:
        key = (item.kind, item.ident)
        at = next(
            (i for i in order if i not in placed and (owned[i].kind, owned[i].ident) == key), None
        )
        if at is None:
            unplaced.append(item)
        else:
            placed[at] = item
    # A stale allow rule (an old nvidia-uvm major) becomes the new one, where it stands.
    for item in [u for u in unplaced if u.kind == "allow"]:
        at = next((i for i, o in owned.items() if i not in placed and o.ident == "stale"), None)
        if at is not None:
            placed[at] = item
            unplaced.remove(item)
    return placed, unplaced


def _free_dev(used: set[int], path: str) -> str:
    free = next((n for n in range(MAX_DEV) if n not in used), None)
    if free is None:
        raise PveConfigError(f"no free devN index (dev0..dev{MAX_DEV - 1} are taken) for {path}")
    used.add(free)
    return f"dev{free}"


def _cr(text: str) -> str:
    """A line's own carriage return (text is a line without its "\\n")."""
    return "\r" if text.endswith("\r") else ""


def _bare(text: str) -> str:
    return text[:-1] if text.endswith("\r") else text


def _check_pending_lxc(
    config: Config, pending: Pending, want: Want, ours: set[int], live: set[int] | None
) -> None:
    """Raw lxc.* lines in [pve:pending] (a hand edit: the API cannot set them) replace every
    lxc.* line of the main section at the next start (vmconfig_apply_pending sets ``lxc`` like
    any key), so they would undo raw-lxc passthrough, or pass a devN node a second time."""
    rest = _split_keep(config.rest)
    lxc = [classify(rest[i].rstrip("\n")) for i in pending.lxc_at]
    if want.passthrough == "raw-lxc" and (lxc or "lxc" in pending.delete):
        raise PveConfigError(
            "the [pve:pending] section has raw lxc.* lines (or deletes them): at the next start "
            "PVE replaces all the main section's lxc.* lines with them, the raw-lxc passthrough "
            "lines included; changed nothing. Move them into the main section or remove them, "
            "then run again"
        )
    doubled = [
        _bare(ln.text)
        for ln in lxc
        if ln.key == MOUNT_KEY and _owned(ln, want, ours, live) is not None
    ]
    if doubled:
        raise PveConfigError(
            f"the [pve:pending] section bind-mounts node(s) this module passes as devN entries "
            f"({'; '.join(repr(t) for t in doubled[:3])}): at the next start they would be "
            "passed twice and the start fails; changed nothing. Remove those lines, then run "
            "again"
        )


def plan(config: Config, want: Want) -> Plan:
    """The edit that makes the managed lines match ``want`` as PVE applies the config at the
    next start (its [pve:pending] section first, vmconfig_apply_pending); every other line is
    kept."""
    validate(want)
    pending = pending_of(config)
    majors = want.majors
    ours = {195} | {
        m
        for m in (major_of(driver_of(d) or "", majors or {}) for d in want.devices)
        if m is not None
    }
    live = set(majors.values()) if majors is not None else None
    _check_pending_lxc(config, pending, want, ours, live)
    text = config.render()
    newline = text.find("\n")
    # New lines end as the file's first line does: a CRLF config stays CRLF.
    cr = "\r" if newline > 0 and text[newline - 1] == "\r" else ""
    lines = list(config.lines)
    #: id of a line that took another's place -> the config's own line it replaced.
    origin: dict[int, Line] = {}

    # A pending devN for a managed node is set in main now, as `pct set -devK VALUE` does: its
    # pending entry goes, its index leaves the delete list, its options are kept (the newest
    # intent). Left pending beside the entry the module writes, it would create the node a
    # second time at the next start, and the start fails (mknod: File exists).
    folded = {
        k: v
        for k, v in pending.dev_values().items()
        if _dev_opts(v).get("path", "") in want.devices
    }
    prefer_ids = _fold(lines, folded, cr, origin)
    owned = {
        i: item
        for i, item in enumerate(_owned(ln, want, ours, live) for ln in lines)
        if item is not None
    }
    doomed = _hidden_devs(lines, set(pending.dev_values()) - set(folded))
    prefer = {i for i, ln in enumerate(lines) if id(ln) in prefer_ids}
    matchable = {i: item for i, item in owned.items() if i not in doomed}
    placed, unplaced = _match(matchable, _wanted(want), prefer)
    out = _rewrite(config, lines, owned, placed, want.mode.rjust(4, "0"), origin)
    # A devN whose last line went: PVE would read an earlier line of that key next, hidden
    # until now; those go too, as PVE's own write of the config drops them.
    last = {ln.dev_index: i for i, ln in enumerate(lines) if ln.dev_index is not None}
    gone = {k for k, i in last.items() if i in owned and i not in placed}
    out = [ln for ln in out if ln.dev_index not in gone]

    used = {ln.dev_index for ln in out if ln.dev_index is not None}
    used |= config.pending_dev_indexes()
    used |= {int(m.group(1)) for m in map(_DEV.match, pending.delete) if m}
    for item in unplaced:
        key = _free_dev(used, item.ident) if item.kind == "dev" else item.key
        out.insert(_insert_at(out, item), classify(f"{key}: {item.value}{cr}"))
    option_lines = _set_options(out, want.options, cr)

    # What changed in main, by line: a line kept is the same object.
    before_ids = {id(ln) for ln in config.lines}
    after_ids = {id(ln) for ln in out}
    removed = [_bare(ln.text) for ln in config.lines if id(ln) not in after_ids]
    added = [_bare(ln.text) for ln in out if id(ln) not in before_ids]
    replaced = [(_bare(origin[id(ln)].text), _bare(ln.text)) for ln in out if id(ln) in origin]
    ours_now = [ln for ln in out if _owned(ln, want, ours, live) is not None]
    mine = {id(ln) for ln in ours_now + option_lines}
    managed = tuple(_bare(ln.text) for ln in out if id(ln) in mine)
    written = {f"dev{k}" for k in folded} | {
        f"dev{ln.dev_index}" for ln in ours_now if ln.dev_index is not None
    }
    rest, pending_removed, pending_added = _edit_pending(config, pending, folded, written)
    # A pending-only edit (a delete: that named a kept index) changes nothing the running
    # container has: no restart, which would also apply the admin's other pending changes.
    passthrough_changed = any(classify(t).key not in BOOT_KEYS for t in removed + added)
    # An empty main section gets whole lines; elsewhere the last line keeps its own ending.
    final_newline = config.final_newline or (not config.lines and bool(out))
    if out and not final_newline:
        out = _end_as_before(out, config.lines[-1], cr)
    return Plan(
        config.render(),
        Config(tuple(out), final_newline, rest).render(),
        managed,
        tuple(added),
        tuple(removed),
        tuple(replaced),
        passthrough_changed,
        tuple(pending_removed),
        tuple(pending_added),
    )


def _fold(lines: list[Line], folded: dict[int, str], cr: str, origin: dict[int, Line]) -> set[int]:
    """Set each folded pending devK in main (where main's devK stands, else after the other
    devN entries); returns the ids of those lines."""
    ids: set[int] = set()
    last = {ln.dev_index: i for i, ln in enumerate(lines) if ln.dev_index is not None}
    inserts: list[Line] = []
    for k, value in sorted(folded.items()):
        at = last.get(k)
        if at is not None and lines[at].value == value:
            new = lines[at]  # the same as main's: PVE's cleanup_pending drops it
        elif at is not None:
            new = classify(f"dev{k}: {value}{_cr(lines[at].text)}")
            origin[id(new)] = lines[at]
            lines[at] = new
        else:
            new = classify(f"dev{k}: {value}{cr}")
            inserts.append(new)
        ids.add(id(new))
    if inserts:
        at = _insert_at(lines, _Item("dev", "", "dev", ""))
        lines[at:at] = inserts
    return ids


def _hidden_devs(lines: list[Line], pending_keys: set[int]) -> set[int]:
    """Main devN lines PVE will not use as they stand: one a later line of the same key hides
    (the last one wins), or one a pending value replaces at the next start. A managed node on
    such a line is written on another."""
    last = {ln.dev_index: i for i, ln in enumerate(lines) if ln.dev_index is not None}
    return {
        i
        for i, ln in enumerate(lines)
        if ln.dev_index is not None and (last[ln.dev_index] != i or ln.dev_index in pending_keys)
    }


def _rewrite(
    config: Config,
    lines: list[Line],
    owned: dict[int, _Item],
    placed: dict[int, _Item],
    mode: str,
    origin: dict[int, Line],
) -> list[Line]:
    """The lines kept, each owned line rewritten to its item where it stands (an owned line no
    item took is left out)."""
    before_ids = {id(ln) for ln in config.lines}
    out: list[Line] = []
    for i, line in enumerate(lines):
        item = placed.get(i)
        if i in owned and item is None:
            continue
        if item is None:
            new_text = None
        elif item.kind == "dev":
            value = _dev_value(line.key, line.value, mode)
            new_text = None if value == line.value else f"{line.key}: {value}"
        else:
            new_text = None if _same(item, line) else f"{item.key}: {item.value}"
        if new_text is None:
            out.append(line)
            continue
        out.append(classify(new_text + _cr(line.text)))
        if id(line) in before_ids or id(line) in origin:
            origin[id(out[-1])] = origin.get(id(line), line)
    return out


def _edit_pending(
    config: Config, pending: Pending, folded: dict[int, str], written: set[str]
) -> tuple[str, list[str], list[str]]:
    """The rest of the file after the pending edit: the folded entries go, and the indexes
    the module writes leave the delete list (Config.pm remove_from_pending_delete, as `pct set`
    does); with the pending lines removed and the one added."""
    rest = _split_keep(config.rest)
    drop = {i for k in folded for i in pending.keys[f"dev{k}"][1]}
    changed = set(drop)
    added: list[str] = []
    keep = {k: force for k, force in pending.delete.items() if k not in written}
    if pending.delete_at is not None and keep != pending.delete:
        at = pending.delete_at
        changed.add(at)
        if keep:
            body = rest[at].rstrip("\n")
            added.append(f"delete: {_print_delete(keep)}")
            rest[at] = added[-1] + _cr(body) + rest[at][len(body) :]
        else:
            drop.add(at)
    removed = [_bare(_split_keep(config.rest)[i].rstrip("\n")) for i in sorted(changed)]
    return "".join(r for i, r in enumerate(rest) if i not in drop), removed, added


def _end_as_before(out: list[Line], old_last: Line, cr: str) -> list[Line]:
    """A file without a newline at its end: the old last line, no longer last, gets one in the
    file's style (CRLF too), and the last line ends as the old last line did."""
    body = [
        classify(ln.text + cr) if ln is old_last and _cr(ln.text) != cr else ln for ln in out[:-1]
    ]
    last = out[-1]
    if _cr(last.text) != _cr(old_last.text):
        last = classify(_bare(last.text) + _cr(old_last.text))
    return [*body, last]


def _set_options(lines: list[Line], options: tuple[tuple[str, str], ...], cr: str) -> list[Line]:
    """Set each boot key in place (a repeated key: the first one, the others removed), or insert
    it among the plain keys in PVE's alphabetical order; returns the lines it owns."""
    owned: list[Line] = []
    for key, value in options:
        at = [i for i, ln in enumerate(lines) if ln.kind == "key" and ln.key == key]
        for i in reversed(at[1:]):
            lines.pop(i)
        if at and lines[at[0]].value == value:
            owned.append(lines[at[0]])
            continue
        if at:
            new = classify(f"{key}: {value}{_cr(lines[at[0]].text)}")
            lines[at[0]] = new
        else:
            new = classify(f"{key}: {value}{cr}")
            plain = [i for i, ln in enumerate(lines) if ln.kind == "key" and ln.dev_index is None]
            later = [i for i in plain if lines[i].key > key]
            pos = later[0] if later else (plain[-1] + 1 if plain else len(lines))
            lines.insert(pos, new)
        owned.append(new)
    return owned


def _insert_at(lines: list[Line], item: _Item) -> int:
    """Next to the lines of its kind; else a devN entry before the raw lxc lines and a raw line
    after them (where `pct set` puts them); else after the last line that is not blank."""

    def after_last(pred: Callable[[Line], bool]) -> int | None:
        found = [i for i, ln in enumerate(lines) if pred(ln)]
        return found[-1] + 1 if found else None

    end = after_last(lambda ln: ln.kind != "blank") or 0
    if item.kind == "dev":
        at = after_last(lambda ln: ln.dev_index is not None)
        if at is None:
            at = next((i for i, ln in enumerate(lines) if ln.kind == "lxc"), None)
        return end if at is None else at
    keys = (ALLOW_KEY, ALLOW_KEY_V1) if item.kind == "allow" else (MOUNT_KEY,)
    at = after_last(lambda ln: ln.kind == "lxc" and ln.key in keys)
    if at is None:
        at = after_last(lambda ln: ln.kind == "lxc")
    return end if at is None else at


# --- reading and writing the file like PVE ---------------------------------------------------


def vmid_of(path: str) -> int:
    m = re.fullmatch(r"(\d+)\.conf", os.path.basename(path))
    if not m:
        raise PveConfigError(
            f"{path} is not a container config: PVE names them /etc/pve/lxc/<vmid>.conf"
        )
    return int(m.group(1))


def lock_path(vmid: int, lock_dir: str = LOCK_DIR) -> str:
    return os.path.join(lock_dir, f"pve-config-{vmid}.lock")


@contextlib.contextmanager
def config_lock(path: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """pve-container's config lock: an exclusive flock on ``path``, waited for up to
    ``timeout`` seconds (PVE::Tools::lock_file_full)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"another tool holds {path} (pct set, the web UI, a backup or migration is "
                    f"changing this container): waited {timeout:g} s and changed nothing; "
                    "run again when it is done"
                )
            time.sleep(0.05)
        yield
    finally:
        os.close(fd)


#: pmxcfs keeps no file larger than this (MEMDB_MAX_FILE_SIZE), so a config is never larger.
MAX_CONFIG_BYTES = 1024 * 1024


def _symlink_error(path: str) -> PveConfigError:
    return PveConfigError(
        f"{path} is a symbolic link: PVE keeps each container's config as a file of its own in "
        "/etc/pve/lxc, never a link, and writing through one would leave its target behind "
        "(or replace the link). Changed nothing: put the config itself there, or give path the "
        "real config, then run again"
    )


def _read_regular(path: str, limit: int, what: str, *, follow: bool = False) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file, opened without blocking on a FIFO
    (O_NONBLOCK) and, unless ``follow``, without following a link at its last step."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _symlink_error(path) from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PveConfigError(
                f"{path} is not a regular file (a FIFO, device or directory), so not {what}; "
                "changed nothing. Fix the path, then run again"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str) -> str:
    """The config as text; bytes that are not UTF-8 survive the round trip (surrogateescape).
    A regular file only, never read through a link, no larger than pmxcfs allows."""
    data = _read_regular(path, MAX_CONFIG_BYTES, "a PVE container config")
    if len(data) > MAX_CONFIG_BYTES:
        raise PveConfigError(
            f"{path} is larger than {MAX_CONFIG_BYTES} bytes, more than pmxcfs keeps for a "
            "file: not a PVE container config; changed nothing. Fix path, then run again"
        )
    return data.decode("utf-8", "surrogateescape")


def write_like_pve(path: str, text: str) -> None:
    """PVE::Tools::file_set_contents: ``<file>.tmp.<pid>`` beside it, created with the file's
    own mode (pmxcfs refuses chmod/chown, and keeps 0640 root:www-data itself), then renamed
    over it, so a reader sees the old file or the new one, never half of one."""
    perm = os.stat(path).st_mode & 0o777
    tmp = f"{path}.tmp.{os.getpid()}"
    data = text.encode("utf-8", "surrogateescape")
    fd = -1
    for _ in range(3):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, perm)
            break
        except FileExistsError:
            os.unlink(tmp)  # a leftover of a process that had our pid
    if fd < 0:
        raise PveConfigError(f"cannot create {tmp}: it keeps reappearing")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Result:
    vmid: int
    plan: Plan
    #: Majors the raw-lxc rules use (empty in devn mode).
    majors: dict[str, int]


def check_editable(config: Config, path: str) -> None:
    """Refuse a config another operation owns, or one with lines PVE cannot read."""
    lock = config.main_value("lock")
    if lock is not None:
        raise PveConfigError(
            f"{path} has 'lock: {lock}': a {lock} owns container {vmid_of(path)} right now; "
            f"changed nothing. Wait for it to finish (or `pct unlock {vmid_of(path)}` if it is "
            "a leftover of a failed run), then run again"
        )
    bad = config.unparsed()
    if bad:
        shown = "; ".join(f"line {n}: {text!r}" for n, text in bad[:5])
        raise PveConfigError(
            f"{path} has line(s) PVE does not understand ({shown}): changed nothing and kept "
            "them as they are. Fix or remove them (pct config shows what PVE reads), then run "
            "again"
        )


def apply(
    path: str,
    want: Want,
    *,
    check: bool = False,
    proc_devices: str = "/proc/devices",
    lock_dir: str = LOCK_DIR,
    timeout: float = LOCK_TIMEOUT,
) -> Result:
    """Make the managed lines of ``path`` match ``want``; in check mode, only say what would
    change. Raises PveConfigError (nothing written) on bad input."""
    vmid = vmid_of(path)
    validate(want)
    if os.path.islink(path):
        raise _symlink_error(path)
    if not os.path.exists(path):
        raise PveConfigError(
            f"container {vmid} does not exist on this host: {path} is missing "
            "(`pct list` shows the containers; fix ct200_site.pve.vmid or create it)"
        )
    majors: dict[str, int] = {}
    if want.passthrough == "raw-lxc":
        majors = read_proc_devices(proc_devices)
        if "nvidia-uvm" not in majors:
            raise PveConfigError(
                f"nvidia-uvm is not in {proc_devices}: raw-lxc mode writes its current (dynamic) "
                "major, so load the module first (modprobe nvidia_uvm && nvidia-modprobe -u -c0; "
                "playbooks/host.yml --tags host_devices does it, and at every boot), then re-run"
            )
    elif os.path.exists(proc_devices):
        majors = read_proc_devices(proc_devices)
    want = Want(want.devices, want.passthrough, want.mode, majors or None, want.options)
    # Check mode writes nothing, and PVE replaces the file by rename: a read needs no lock.
    guard = contextlib.nullcontext() if check else config_lock(lock_path(vmid, lock_dir), timeout)
    with guard:
        config = parse(read_text(path))
        check_editable(config, path)
        try:
            edit = plan(config, want)
        except PveConfigError as exc:
            raise PveConfigError(f"{path}: {exc}") from exc
        if edit.changed and not check:
            write_like_pve(path, edit.after)
            if read_text(path) != edit.after:
                raise PveConfigError(f"{path} does not read back as written: check the host")
    raw = want.passthrough == "raw-lxc"
    return Result(vmid, edit, {k: v for k, v in majors.items() if raw and k.startswith("nvidia")})
