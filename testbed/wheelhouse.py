"""The testbed's wheelhouse: the release step (scripts/wheelhouse.py), for the machines' Python.

The machines have no route to the Internet, as a production container need not have one, so the
playbooks install ct200-tools there from the wheelhouse the controller builds, exactly as they do
in production. The testbed keeps its own (``.testbed/wheelhouse.tar``), built for bookworm's
python3 and glibc, so a release wheelhouse built for another target in dist/ is never replaced.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from testbed.config import TARGET_GLIBC, TARGET_PYTHON, Settings
from testbed.errors import TestbedError
from testbed.system import Runner


def archive(settings: Settings) -> Path:
    """The wheelhouse as one tar file: one checksum for Ansible's copy, not one per wheel."""
    return settings.repo / ".testbed" / "wheelhouse.tar"


def build(settings: Settings, runner: Runner) -> tuple[Path, float]:
    """Bring the wheelhouse up to date; returns the archive and the seconds."""
    started = time.monotonic()
    tar = archive(settings)
    proc = runner.run(
        [
            sys.executable,
            settings.repo / "scripts" / "wheelhouse.py",
            "--out",
            tar,
            "--python-version",
            TARGET_PYTHON,
            "--glibc",
            ".".join(map(str, TARGET_GLIBC)),
        ],
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise TestbedError(
            f"scripts/wheelhouse.py could not build the testbed's wheelhouse "
            f"(exit {proc.returncode})",
            detail=(proc.stderr or proc.stdout)[-2000:],
            fix="see its message above; `up --no-wheelhouse` boots the machines without one",
        )
    return tar, time.monotonic() - started
