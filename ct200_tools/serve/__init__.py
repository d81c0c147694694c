"""Inference servers as systemd units: the commands behind `ct200-serve`: preflight and
readiness inside the unit, and switching the serving set (switch). What each server runs is
ct200_tools.engines; the serving set itself is ct200_tools.serving."""

import sys

from ct200_tools import engines as engine

# ct200_tools.serve.engine was merged into ct200_tools.engines: the old name stays importable
# (the same module object, so a patched constant is seen by both names).
sys.modules[__name__ + ".engine"] = engine

__all__ = ["engine"]
