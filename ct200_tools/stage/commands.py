"""What each ct200-stage command does, between parsed options and printed output.

Each function returns a `CommandResult` (JSON-able data plus the text lines to show) or raises a
StageError; the CLI only prints. The spec is imported lazily: the engine and this module work
without PyYAML (the benchmark runs them on machines that have nothing installed).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ct200_tools.fsutil import write_atomic
from ct200_tools.stage import tree
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.errors import (
    LockBusyError,
    RefusedError,
    SourceError,
    StageError,
    VerifyError,
)
from ct200_tools.stage.lock import holder_pid
from ct200_tools.stage.manifest import default_manifest_path, load_manifest
from ct200_tools.stage.options import ManifestCommand, StageCommand, StatusCommand, VerifyCommand
from ct200_tools.stage.progress import ProgressSink
from ct200_tools.stage.sizes import format_size
from ct200_tools.stage.stager import StageOptions, stage
from ct200_tools.stage.status import model_status
from ct200_tools.stage.verify import embedded_manifest, verify_tree

if TYPE_CHECKING:
    from ct200_tools.spec import ModelSpec, SiteSpec


@dataclass(frozen=True)
class CommandResult:
    data: dict[str, object]
    lines: list[str]
    ok: bool = True


def make_manifest(source: str, o: ManifestCommand, progress: ProgressSink) -> CommandResult:
    name = o.name or os.path.basename(os.path.realpath(source))
    path = o.manifest_path or default_manifest_path(name)
    report = build_manifest(
        source,
        name,
        jobs=o.jobs,
        read_mode=o.read_mode,
        lfs=o.lfs,
        model_info=o.model_info,
        progress=progress,
    )
    new = report.manifest
    action = "written"
    if os.path.exists(path):
        try:
            old_digest: str | None = load_manifest(path).digest
        except SourceError:
            old_digest = None
        if old_digest == new.digest:
            action = "unchanged"
        elif not o.force:
            raise RefusedError(
                f"a manifest for {name} already exists at {path} and the source now differs "
                f"(was {old_digest or 'unreadable'}, now {new.digest}); nothing was written",
                f"if the source changed by accident, restore it (ct200-stage verify {source} "
                "shows which files); if on purpose, pass --force to record the new content",
            )
        else:
            action = "replaced"
    if action != "unchanged":
        write_atomic(path, new.to_json())
    data: dict[str, object] = {
        "action": action,
        "manifest_path": path,
        "name": name,
        "source": new.source,
        "digest": new.digest,
        "algorithm": new.algorithm,
        "chunk_size": new.chunk_size,
        "files": len(new.files),
        "bytes": new.total_bytes,
        "lfs_sha256_checked": report.lfs_checked,
        "lfs_sha256_unknown": report.lfs_unknown,
        "seconds": round(report.seconds, 3),
    }
    lfs_line = (
        f"; sha256 matched Hugging Face's for {report.lfs_checked} file(s)"
        if report.lfs_checked
        else ("; no Hugging Face LFS metadata found" if o.lfs else "")
    )
    lines = [
        f"manifest {action}: {path}",
        f"  {name}: {len(new.files)} files, {format_size(new.total_bytes)}, {new.algorithm}, "
        f"{new.digest}{lfs_line}",
        *(f"  {w}" for w in report.warnings),
    ]
    data["warnings"] = list(report.warnings)
    return CommandResult(data, lines)


def stage_model(target: Sequence[str], o: StageCommand, progress: ProgressSink) -> CommandResult:
    reserve_bytes = _size(o.reserve) if o.reserve is not None else None
    shm_size = None
    if len(target) == 1:
        model, spec = _model_from_spec(target[0], o.spec_path)
        source, dst, name = model.source, model.staged, o.name or model.name
        if reserve_bytes is None:
            reserve_bytes = spec.shm.reserve_ram
        shm_size = spec.shm.size
    else:
        source, dst = target
        name = o.name or os.path.basename(os.path.realpath(source))
    options = StageOptions(
        jobs=o.jobs,
        read_mode=o.read_mode,
        reserve=reserve_bytes or 0,
        replace=o.replace,
        wait=o.wait,
        create_manifest=o.create_manifest,
        shm_size=shm_size,
    )
    result = stage(
        source,
        dst,
        manifest_path=o.manifest_path or default_manifest_path(name),
        name=name,
        options=options,
        progress=progress,
    )
    if result.outcome == "already-staged":
        head = f"{result.name} is already staged at {result.target} ({result.manifest_digest})"
    else:
        head = (
            f"staged {result.name} -> {result.target}: {result.files} files, "
            f"{format_size(result.bytes)}; copied {format_size(result.bytes_copied)} in "
            f"{result.seconds:.1f} s ({format_size(result.rate)}/s, {result.read_mode} reads), "
            f"every chunk verified ({result.algorithm})"
        )
    return CommandResult(result.to_dict(), [head, *(f"  {n}" for n in result.notes)])


def verify_path(path: str, o: VerifyCommand, progress: ProgressSink) -> CommandResult:
    if not os.path.isdir(path) and os.sep not in path:
        model, _spec = _model_from_spec(path, o.spec_path)
        path = model.staged
    pid = holder_pid(path)
    if pid is not None:
        raise LockBusyError(
            f"a stage of {path} is in progress (pid {pid}): the copy there is not published yet, "
            "or is about to be replaced",
            "wait for the stage to finish, then verify again",
        )
    restage: str | None = None
    if o.manifest_path is not None:
        manifest = load_manifest(o.manifest_path)
        against = o.manifest_path
    else:
        embedded = embedded_manifest(path) if os.path.isdir(path) else None
        if embedded is None:
            against = default_manifest_path(os.path.basename(os.path.realpath(path)))
            manifest = load_manifest(against)
        else:
            manifest, against = embedded, f"{path}/.ct200-manifest.json"
            status = model_status(path)
            if status.state not in ("staged", "mismatch"):
                raise StageError(f"{path}: {status.state}: {status.detail}", "stage it first")
            restage = _restage_command(path)
    try:
        result = verify_tree(path, manifest, jobs=o.jobs, read_mode=o.read_mode, progress=progress)
    except VerifyError as exc:
        if restage is not None:
            exc.fix = f"restage it from the persistent copy: {restage}"
        raise
    data = {**result.to_dict(), "manifest_path": against}
    lines = [
        f"verified {path}: {result.files} files, {format_size(result.bytes)}, every chunk matches "
        f"{against} ({manifest.digest})"
    ]
    return CommandResult(data, lines)


def status(paths: Sequence[str], o: StatusCommand) -> CommandResult:
    rows: list[dict[str, object]] = []
    targets: list[tuple[str, str, str | None]]
    if paths:
        targets = [(os.path.basename(os.path.abspath(p)), p, None) for p in paths]
    else:
        spec = _load_spec(o.spec_path)
        targets = [(m.name, m.staged, default_manifest_path(m.name)) for m in spec.models]
    for name, staged, manifest in targets:
        have_manifest = manifest is not None and os.path.exists(manifest)
        st = model_status(staged, o.deep, manifest=manifest if have_manifest else None)
        row = {"name": name, **st.to_dict(), "manifest_path": manifest}
        if manifest is not None and not have_manifest:
            row["note"] = f"no source manifest at {manifest}: make one with ct200-stage manifest"
        rows.append(row)
    ok = all(r["state"] == "staged" for r in rows)
    width = max([len(str(r["name"])) for r in rows] + [4])
    lines = [f"{'MODEL':<{width}}  {'STATE':<10}  {'SIZE':>10}  DETAIL"]
    for r in rows:
        size = format_size(cast(int, r["bytes_expected"])) if r["bytes_expected"] else "-"
        lines.append(f"{r['name']!s:<{width}}  {r['state']!s:<10}  {size:>10}  {r['detail']}")
        lines += [f"{'':<{width}}  {'':<10}  {'':>10}  {e}" for e in cast(list[str], r["errors"])]
        if "note" in r:
            lines.append(f"{'':<{width}}  {'':<10}  {'':>10}  {r['note']}")
    if not rows:
        lines = ["no models in the spec"]
    return CommandResult({"models": rows, "all_staged": ok}, lines, ok)


def _restage_command(staged: str) -> str | None:
    """The command that restages a staged tree from where its marker says it came from."""
    try:
        marker = tree.read_marker(staged)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if marker is None or not marker.source:
        return None
    name = marker.name or os.path.basename(os.path.abspath(staged))
    manifest = marker.manifest_path or default_manifest_path(name)
    argv = ["stage", marker.source, os.path.abspath(staged), "--manifest", manifest, "--replace"]
    return shlex.join(["ct200-stage", *argv])


def _size(text: str) -> int:
    from ct200_tools.spec import parse_size  # noqa: PLC0415

    try:
        return parse_size(text)
    except ValueError as exc:
        raise StageError(f"--reserve: {exc}", "write a size like 64G") from exc


def _load_spec(spec_path: str | None) -> SiteSpec:
    from ct200_tools.spec import find_spec, load_spec  # noqa: PLC0415

    choice = find_spec(spec_path)  # the doctor's resolver: --spec, $CT200_SPEC, the default
    if choice.path is None:
        raise StageError(
            choice.describe(),
            "pass --spec PATH (or set CT200_SPEC), or give SRC DST paths instead of a model name",
        )
    return load_spec(choice.path)


def _model_from_spec(name: str, spec_path: str | None) -> tuple[ModelSpec, SiteSpec]:
    spec = _load_spec(spec_path)
    model = spec.model(name)
    if model is None:
        known = ", ".join(m.name for m in spec.models) or "none"
        raise StageError(
            f"no model {name!r} in the site spec {spec.source or spec_path}",
            f"use one of: {known}; or give SRC DST paths",
        )
    return model, spec
