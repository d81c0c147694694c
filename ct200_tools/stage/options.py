"""ct200-stage's options, each written once.

Each command's options are one frozen dataclass; every field carries its command-line spelling
(flags, help, metavar, range) as plain data, so the stage package needs no click. cli/stage.py
builds the click options from these fields, in field order, and hands the filled dataclass to
stage/commands.py, which reads it by attribute: a new option is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ct200_tools.stage.engine import READ_MODES, ReadMode
from ct200_tools.stage.stager import default_jobs


@dataclass(frozen=True)
class Spelling:
    """How one option is spelled on the command line (field metadata under "cli")."""

    decls: tuple[str, ...]
    help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    #: A numeric range, of ints or floats as the field's default is.
    min: int | None = None
    max: int | None = None
    existing_file: bool = False
    show_default: bool = False
    #: The name of an option the CLIs share (cli/options.py), used as it is there.
    shared: str | None = None


def option(*decls: str, default: Any = None, **spelling: Any) -> Any:
    return field(default=default, metadata={"cli": Spelling(decls, **spelling)})


def manifest_option() -> Any:
    return option(
        "--manifest",
        metavar="PATH",
        help="Manifest file [default: $CT200_MANIFEST_DIR or /var/lib/ct200/manifests, "
        "then <name>.json].",
    )


def spec_option() -> Any:
    return option("--spec", shared="spec")


def read_mode_option() -> Any:
    return option(
        "--read-mode",
        default="buffered",
        choices=READ_MODES,
        show_default=True,
        help="Source reads through the page cache (dropped behind us; measured fastest), or "
        "O_DIRECT (direct; auto: where the filesystem allows).",
    )


def jobs_option() -> Any:
    return field(
        default_factory=default_jobs,
        metadata={
            "cli": Spelling(
                ("-j", "--jobs"), min=1, max=256, show_default=True, help="Parallel chunk reads."
            )
        },
    )


@dataclass(frozen=True)
class ManifestCommand:
    name: str | None = option("--name", help="Model name [default: the source directory's name].")
    manifest_path: str | None = manifest_option()
    force: bool = option(
        "--force", default=False, help="Replace an existing manifest that differs."
    )
    lfs: bool = option(
        "--lfs/--no-lfs",
        default=True,
        show_default=True,
        help="Also check sha256 against Hugging Face LFS metadata found in the source (slower).",
    )
    model_info: str | None = option(
        "--model-info",
        existing_file=True,
        help="Hub API model info JSON (/api/models/<id>?blobs=true) giving siblings[].lfs.sha256.",
    )
    jobs: int = jobs_option()
    read_mode: ReadMode = read_mode_option()  # noqa: RUF009 - a field(), fresh per class


@dataclass(frozen=True)
class StageCommand:
    spec_path: str | None = spec_option()
    manifest_path: str | None = manifest_option()
    name: str | None = option(
        "--name",
        help="Model name for messages and the manifest [default: from the spec "
        "or the source directory].",
    )
    create_manifest: bool = option(
        "--create-manifest",
        default=False,
        help="With no manifest yet: build it from this copy (trusting the source as read).",
    )
    replace: bool = option(
        "--replace",
        default=False,
        help="Swap out what ct200-stage staged at DST (another model, or a copy that does not "
        "verify: it is re-hashed first) atomically once the new copy is verified. Never touches "
        "a directory ct200-stage did not make.",
    )
    wait: float = option(
        "--wait",
        default=0.0,
        min=0,
        metavar="SECONDS",
        help="Wait this long for another stage of the same target to finish.",
    )
    reserve: str | None = option(
        "--reserve",
        metavar="SIZE",
        help="RAM to leave free, e.g. 64G [default: the spec's shm.reserve_ram, else 0].",
    )
    jobs: int = jobs_option()
    read_mode: ReadMode = read_mode_option()  # noqa: RUF009 - a field(), fresh per class


@dataclass(frozen=True)
class VerifyCommand:
    manifest_path: str | None = manifest_option()
    spec_path: str | None = spec_option()
    jobs: int = jobs_option()
    read_mode: ReadMode = read_mode_option()  # noqa: RUF009 - a field(), fresh per class


@dataclass(frozen=True)
class StatusCommand:
    spec_path: str | None = spec_option()
    deep: bool = option("--deep", default=False, help="Re-hash every staged file (reads it all).")
