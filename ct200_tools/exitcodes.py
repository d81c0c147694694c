"""Exit codes shared by ct200-doctor and ct200-stage: one meaning per number, in both tools."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    #: Done: clean (doctor); staged, verified or written (stage).
    OK = 0
    #: Warnings only, and only with the doctor's --strict.
    WARNINGS = 1
    #: A check failed or the input was bad; the message says what to do.
    FAILURES = 2
    #: The tool itself broke (a bug); the message says how to get the traceback.
    BROKE = 3
    #: The doctor's name for BROKE (an alias: same member).
    DOCTOR_BROKE = 3
    #: Stopped by SIGINT (128 + 2, as shells report it); a stage resumes when run again.
    INTERRUPTED = 130
