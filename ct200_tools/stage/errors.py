"""Failures that staging diagnoses, each with what went wrong and how to fix it.

The CLI turns a `StageError` into one message, one fix line and exit code 2 (`Exit.FAILURES`);
anything else is a bug in the tool and exits 3 (`Exit.BROKE`). Keeping every expected failure in
this hierarchy is what lets the CLI promise "never a traceback" without hiding real bugs.
"""

from __future__ import annotations


class StageError(Exception):
    """A failure with a diagnosis: `message` says what, `fix` says what to do about it."""

    kind = "failed"

    def __init__(self, message: str, fix: str = "", *, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.details = details

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "message": self.message,
            "fix": self.fix,
            "details": list(self.details),
        }


class VerifyError(StageError):
    """Bytes, sizes or the file list differ from the manifest."""

    kind = "verification"


class CapacityError(StageError):
    """The destination cannot hold the model (filesystem or memory), found before any write."""

    kind = "capacity"


class RefusedError(StageError):
    """Doing it would destroy something that is not ours to destroy."""

    kind = "refused"


class LockBusyError(StageError):
    """Another stage of the same target holds the lock."""

    kind = "busy"


class SourceError(StageError):
    """The source or the manifest cannot be read, or the source changed since the manifest."""

    kind = "source"


class TargetError(StageError):
    """The target cannot be a model's directory: '..' in it, a file in its path, a mount point."""

    kind = "target"
