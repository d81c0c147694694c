"""One ct200-stage run in its own process, as the benchmark times it: python3 -m ... SRC DST M J."""

from __future__ import annotations

import json
import sys

from ct200_tools.stage.engine import ReadMode
from ct200_tools.stage.stager import StageOptions, stage


def main() -> None:
    src, dst, manifest, jobs, mode = sys.argv[1:6]
    read_mode: ReadMode = "direct" if mode == "direct" else "buffered"
    result = stage(
        src, dst, manifest_path=manifest, options=StageOptions(jobs=int(jobs), read_mode=read_mode)
    )
    print(json.dumps({"read_mode": result.read_mode, "seconds": result.seconds}))


if __name__ == "__main__":
    main()
