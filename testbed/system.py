"""Running programs and checking the machine can host a testbed: root, the tools, the kernel."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from testbed.errors import TestbedError

Argv = Sequence[str | Path]

#: tool -> the Debian/Ubuntu package that ships it.
TOOLS = {
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mount": "mount",
    "umount": "mount",
}
BUILD_TOOLS = {"debootstrap": "debootstrap"}


class Runner:
    """Runs argv lists (never shell strings); the one place the testbed starts a program."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose

    def run(
        self,
        argv: Argv,
        *,
        check: bool = True,
        input_text: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 120,
    ) -> subprocess.CompletedProcess[str]:
        args = [str(a) for a in argv]
        if self.verbose:
            print("+ " + shlex.join(args), flush=True)
        try:
            proc = subprocess.run(
                args,
                input=input_text,
                capture_output=True,
                text=True,
                env=None if env is None else {**os.environ, **env},
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise TestbedError(
                f"{args[0]} is not installed", fix=install_hint({args[0]: TOOLS.get(args[0], "")})
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"`{shlex.join(args)}` did not finish within {timeout}s") from exc
        if check and proc.returncode != 0:
            raise TestbedError(
                f"`{shlex.join(args)}` failed (exit {proc.returncode})",
                detail=(proc.stderr or proc.stdout)[-2000:],
            )
        return proc


def install_hint(missing: Mapping[str, str]) -> str:
    packages = sorted({pkg for pkg in missing.values() if pkg})
    if not packages:
        return "install the missing tools"
    return (
        f"apt-get install -y {' '.join(packages)}  (or run `bash scripts/setup.sh`, "
        "which installs everything the tests need)"
    )


def require_root(euid: int | None = None) -> None:
    if (os.geteuid() if euid is None else euid) != 0:
        raise TestbedError(
            "the testbed needs root: it creates network namespaces and mounts and boots "
            "systemd-nspawn machines",
            fix="run it as root, e.g. `sudo .venv/bin/python -m testbed up`",
        )


def missing_tools(
    tools: Mapping[str, str], which: Callable[[str], str | None] = shutil.which
) -> dict[str, str]:
    return {tool: pkg for tool, pkg in tools.items() if which(tool) is None}


def require_tools(
    tools: Mapping[str, str], which: Callable[[str], str | None] = shutil.which
) -> None:
    missing = missing_tools(tools, which)
    if missing:
        raise TestbedError(
            f"missing tools: {', '.join(sorted(missing))}", fix=install_hint(missing)
        )


def preflight(which: Callable[[str], str | None] = shutil.which, euid: int | None = None) -> None:
    """Everything a warm start needs (a cold build also needs debootstrap: see rootfs.py)."""
    require_root(euid)
    require_tools(TOOLS, which)
    if "overlay" not in Path("/proc/filesystems").read_text():
        # Not fatal: machines fall back to a full copy of the rootfs (slower start).
        print("testbed: overlayfs is not available; machines will use a copy of the rootfs")
