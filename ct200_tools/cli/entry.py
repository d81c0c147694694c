"""Console entry of ct200-doctor: start the slow driver probes, then import the doctor."""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> NoReturn:
    from ct200_tools import warmup  # noqa: PLC0415 - stdlib only, imported before the rest

    warmup.start(sys.argv[1:])
    from ct200_tools.cli.doctor import main as doctor_main  # noqa: PLC0415

    doctor_main()


if __name__ == "__main__":
    main()
