"""The target: which path it is, and what it holds, read before anything is written.

A stage writes only to a model's own directory: a path without '..', under real directories, not a
mount point (publishing renames a directory into place, which a mount point cannot take). What is
already there decides the rest: nothing or an empty directory is used; our own tree of this model
is "already staged"; our own tree of something else is swapped out with --replace; anything that
is not ours (no marker or manifest of ours at its top: someone's files, a directory of other
models) is refused with or without --replace, and the message never suggests deleting it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from ct200_tools.stage import tree
from ct200_tools.stage.errors import RefusedError, SourceError, TargetError
from ct200_tools.stage.manifest import (
    Manifest,
    compare_to_source,
    parse_manifest,
    read_manifest_file,
    scan_tree,
)

#: absent or empty: copy into it; staged: holds this very model, intact; replace: ours, swap it.
TargetKind = Literal["absent", "empty", "staged", "replace"]
_SHOWN = 5


@dataclass(frozen=True)
class TargetState:
    kind: TargetKind
    #: What is there, for the notes (replace).
    detail: str = ""


def target_path(target: str, name: str) -> str:
    """The absolute target with its parent's links resolved; raises TargetError for a path that
    cannot be a model's own directory."""
    if ".." in target.split(os.sep):
        raise TargetError(
            f"target {target} contains '..'",
            f"name the model's own directory directly, e.g. /dev/shm/models/{name}",
        )
    parent, base = os.path.split(os.path.abspath(target))
    if not base:
        raise TargetError(f"{target} names no directory", "give the directory to stage into")
    blocker = _not_a_directory(parent)
    if blocker is not None:
        what = "a file" if os.path.isfile(blocker) else "not a directory"
        raise TargetError(
            f"{blocker} is {what}, not a directory, so {target} cannot be made under it",
            "give a target whose parent directories are directories (or move that file away)",
        )
    dst = os.path.join(os.path.realpath(parent), base)
    if is_mount_point(dst):
        raise TargetError(
            f"{dst} is a mount point: a staged model is published by renaming a directory into "
            "place, which a mount point cannot take",
            f"stage into a directory inside it: {os.path.join(dst, name)}",
        )
    return dst


def inspect(dst: str, manifest: Manifest | None, *, replace: bool, name: str) -> TargetState:
    """Read-only: what dst holds, and whether this stage may use it; raises RefusedError."""
    if not os.path.lexists(dst):
        return TargetState("absent")
    if os.path.islink(dst) or not os.path.isdir(dst):
        raise RefusedError(
            f"{dst} exists and is not a directory",
            f"move it away yourself (it is not ours to delete): mv {dst} {dst}.old",
        )
    entries = os.listdir(dst)
    if not entries:
        return TargetState("empty")
    if not tree.owned(dst):
        raise _not_ours(dst, entries, name)
    digest, problem = check_staged(dst)
    if manifest is not None and digest == manifest.digest and problem is None:
        return TargetState("staged")
    if problem is not None:
        what = f"a staged copy that does not match its own manifest ({problem})"
    elif manifest is None:
        what = f"a staged model (manifest {digest}) and the source has no manifest to compare"
    else:
        what = f"a different staged model (manifest {digest})"
    if not replace:
        raise RefusedError(
            f"{dst} holds {what}; refusing to overwrite it",
            f"run the same command with --replace: it swaps the copy for {name} atomically once "
            "the new one is verified",
        )
    return TargetState("replace", what)


def check_staged(dst: str) -> tuple[str | None, str | None]:
    """(the digest dst is staged with, None) when marker, manifest, file list and sizes agree;
    otherwise (the digest or None, what is wrong)."""
    try:
        marker = tree.read_marker(dst)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"its marker is damaged: {exc}"
    if marker is None:
        return None, "no marker: an unfinished stage"
    try:
        data = read_manifest_file(os.path.join(dst, tree.MANIFEST_NAME))
        if data is None:
            return None, "its manifest cannot be used: there is none"
        manifest = parse_manifest(data, dst)
    except SourceError as exc:
        return None, f"its manifest cannot be used: {exc}"
    if manifest.digest != marker.manifest_digest:
        return None, "marker and manifest disagree"
    try:
        compare_to_source(manifest, scan_tree(dst), dst, "the copy")
    except SourceError as exc:
        return manifest.digest, "; ".join(exc.details[:3]) or exc.message
    changed = changed_since_staged(dst, marker.identities)
    if changed:
        return manifest.digest, "; ".join(changed[:3])
    return manifest.digest, None


def changed_since_staged(root: str, identities: dict[str, tuple[int, int, int, int]]) -> list[str]:
    """The files whose identity (inode, size, mtime, ctime) is not what the marker recorded at
    staging: written or replaced since (same size included), so their content is not trusted."""
    out = []
    for rel, recorded in sorted(identities.items()):
        try:
            now = tree.file_identity(os.stat(os.path.join(root, rel)))
        except OSError as exc:
            out.append(f"{rel}: {exc.strerror or exc}")
            continue
        if now != recorded:
            out.append(changed_message(rel, recorded, now))
    return out


def changed_message(
    rel: str, recorded: tuple[int, int, int, int], now: tuple[int, int, int, int]
) -> str:
    what = "replaced (another inode)" if now[0] != recorded[0] else f"ctime {_ns(now[3])}"
    return (
        f"{rel}: changed since it was staged ({what}, staged at ctime {_ns(recorded[3])}): "
        "content not trusted"
    )


def _ns(value: int) -> str:
    return f"{value // 1_000_000_000}.{value % 1_000_000_000:09d}"


def staged_digest(dst: str) -> str | None:
    """The manifest digest a target is validly staged with, or None (absent, unmarked, broken)."""
    digest, problem = check_staged(dst)
    return digest if problem is None else None


def is_mount_point(path: str) -> bool:
    if os.path.ismount(path):
        return True
    try:  # a bind mount of a directory of the same filesystem has the same st_dev
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            points = {_unescape(line.split()[4]) for line in fh if len(line.split()) > 4}
    except OSError:
        return False
    return path in points


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _not_a_directory(parent: str) -> str | None:
    """The nearest existing ancestor of parent (parent included) when it is not a directory."""
    p = parent
    while not os.path.lexists(p):
        up = os.path.dirname(p)
        if up == p:
            return None
        p = up
    return None if os.path.isdir(p) else p


def _not_ours(dst: str, entries: list[str], name: str) -> RefusedError:
    entries = sorted(entries, key=lambda e: (e.startswith("."), e))
    staged = [e for e in entries if os.path.isfile(os.path.join(dst, e, tree.MARKER_NAME))]
    if staged:
        return RefusedError(
            f"{dst} holds other staged models ({_list(staged)}), it is not one model's own "
            "directory; refusing to touch it, with or without --replace",
            f"name the model's own directory as the target, e.g. {os.path.join(dst, name)}",
        )
    return RefusedError(
        f"{dst} holds files that were not staged by ct200-stage ({_list(entries)}); refusing to "
        "touch it, with or without --replace",
        f"choose another target, or move it away yourself: mv {dst} {dst}.old",
    )


def _list(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
