"""Inference servers as systemd units: what each runs (engine), its unit (render), and the
commands behind `ct200-serve`: preflight and readiness inside the unit, and switching the serving
set (switch). The serving set itself is ct200_tools.serving."""
