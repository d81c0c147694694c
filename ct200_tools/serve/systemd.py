"""systemctl and journalctl, as argv lists with deadlines: what ct200-serve does to units.

No D-Bus library: `systemctl show` prints stable KEY=VALUE blocks, one per unit in the order
asked, and start/stop block until the job is done, which is what a switch wants to time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ct200_tools.systemctl import run_argv, show_argv, show_blocks

#: Runs argv with a timeout (seconds); returns (exit status, stdout, stderr).
Run = Callable[[Sequence[str], float], tuple[int, str, str]]

SHOW_PROPERTIES: Final = ("Id", "LoadState", "ActiveState", "SubState", "Result", "UnitFileState")
#: States in which a unit holds (or is about to hold) its GPUs and port.
RUNNING: Final = ("active", "activating", "reloading", "deactivating")
QUICK_S: Final = 30.0


@dataclass(frozen=True)
class UnitState:
    unit: str
    load: str = ""
    active: str = ""
    sub: str = ""
    result: str = ""
    file_state: str = ""

    @property
    def running(self) -> bool:
        return self.active in RUNNING

    @property
    def enabled(self) -> bool:
        return self.file_state in ("enabled", "enabled-runtime")

    def describe(self) -> str:
        what = f"{self.active} ({self.sub})" if self.sub else self.active or "unknown"
        if self.active == "failed" and self.result:
            what += f", result {self.result}"
        return what


class SystemdError(Exception):
    """systemctl could not be asked at all (not a systemd machine, systemd hung)."""


def parse_show(text: str, units: Sequence[str]) -> dict[str, UnitState]:
    return {
        name: UnitState(
            name,
            block.get("LoadState", ""),
            block.get("ActiveState", ""),
            block.get("SubState", ""),
            block.get("Result", ""),
            block.get("UnitFileState", ""),
        )
        for name, block in show_blocks(text, units).items()
    }


class Systemd:
    def __init__(self, run: Run = run_argv) -> None:
        self.run = run

    def show(self, units: Sequence[str]) -> dict[str, UnitState]:
        if not units:
            return {}
        rc, out, err = self.run(show_argv(units, SHOW_PROPERTIES), QUICK_S)
        if rc != 0:
            raise SystemdError(f"systemctl show: {err.strip() or f'exit {rc}'}")
        states = parse_show(out, units)
        return {u: states.get(u, UnitState(u)) for u in units}

    def show_text(self, units: Sequence[str], properties: Sequence[str]) -> str:
        """`systemctl show` of chosen properties: of ``units``, or of the manager when empty."""
        argv = ["systemctl", "show", "--no-pager", f"--property={','.join(properties)}"]
        rc, out, err = self.run([*argv, *units], QUICK_S)
        if rc != 0:
            raise SystemdError(f"systemctl show: {err.strip() or f'exit {rc}'}")
        return out

    def start(self, unit: str, timeout: float) -> tuple[bool, str]:
        """Blocks until the start job ends: for a server, until ExecStartPost saw it serve."""
        rc, _, err = self.run(["systemctl", "start", unit], timeout)
        return rc == 0, err.strip()

    def stop(self, units: Sequence[str], timeout: float) -> tuple[bool, str]:
        if not units:
            return True, ""
        rc, _, err = self.run(["systemctl", "stop", *units], timeout)
        return rc == 0, err.strip()

    def quick(self, verb: str, units: Sequence[str]) -> tuple[bool, str]:
        """enable, disable, reset-failed: no job to wait for."""
        if not units:
            return True, ""
        rc, _, err = self.run(["systemctl", verb, "--quiet", *units], QUICK_S)
        return rc == 0, err.strip()

    def journal(self, unit: str, lines: int = 12) -> list[str]:
        """The unit's last journal lines of this boot (cat format), for a failure report: lines of
        an earlier boot's run would pass for this one's."""
        argv = [
            "journalctl",
            "--no-pager",
            "--output=cat",
            "--boot",
            f"--lines={lines}",
            f"--unit={unit}",
        ]
        rc, out, _ = self.run(argv, QUICK_S)
        return out.splitlines()[-lines:] if rc == 0 else []
