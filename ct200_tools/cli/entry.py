"""Console entry of ct200-doctor: start the slow driver probes, then import the doctor."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def main() -> NoReturn:
    from ct200_tools.doctor import warmup  # noqa: PLC0415 - stdlib only, imported before the rest

    warmup.start(sys.argv[1:])
    from ct200_tools.cli.doctor import main as doctor_main  # noqa: PLC0415

    try:
        doctor_main()
    except SystemExit as done:
        code = done.code
        if isinstance(code, str):  # sys.exit("message"), as Python prints it
            print(code, file=sys.stderr)
        _leave(1 if isinstance(code, str) else int(code or 0))


def _leave(code: int) -> NoReturn:
    """Exit without the interpreter's teardown: the report is written and flushed by now, and
    tearing down NVML (loaded in this process) and a hundred modules cost ~0.1 s of every run,
    measured on the H200 (benchmarks/doctor/phases.py: "process" against "rendered")."""
    for stream in (sys.stdout, sys.stderr):
        # A reader that closed the pipe, or a closed stdout, was dealt with by the doctor.
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
