"""Inference servers as systemd units, the commands behind `ct200-serve`: what each engine runs
(engines/), the rendered unit, EnvironmentFile and engine config (render), the serving set kept
across reboots (serving), preflight and readiness inside the unit, switching the serving set
(switch), and the container's link of the boot chain (chain, bootsteps)."""
