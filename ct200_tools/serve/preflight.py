"""What a server needs before its engine starts, checked as the service user in the unit's own
sandbox (the first ExecStartPre): the engine's program, its config, its models staged, the GPU
nodes' permissions for that user.

Each problem names the path or model and the fix, so `systemctl status` says why the server did
not start instead of a traceback minutes later. The doctor's gate (the next ExecStartPre, as
root) judges the GPUs and the port.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ct200_tools.engines import ENGINE_CHILD
from ct200_tools.provisioned import playbook_command
from ct200_tools.serve import engines
from ct200_tools.serve.systemd import Systemd, SystemdError
from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec

#: The doctor's engine probe's own child (ct200_tools.engines.base): finds the engine's
#: top-level package without importing it (importing SGLang takes seconds); exit status 1
#: when it is not found. Run here in the unit's environment (not isolated, as the doctor
#: runs it): what the engine will see.
FIND_MODULE: Final = ENGINE_CHILD
FIND_TIMEOUT_S: Final = 60.0
#: The nodes every CUDA process opens; /dev/nvidiaN is numbered by the driver's minor, not the
#: GPU index, so those are the gate's (NVML knows the mapping).
GPU_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm")
READABLE: Final = (
    f"the service user {engines.SERVICE_USER} must be able to read it (not under /root or /home, "
    "which the unit hides with ProtectHome=)"
)


@dataclass(frozen=True)
class Problem:
    what: str
    message: str
    fix: str

    def lines(self) -> list[str]:
        return [f"  {self.what}: {self.message}", f"    fix: {self.fix}"]


#: Stage verdict of a staged path: (staged?, why not).
StageStatus = Callable[[ModelSpec], tuple[bool, str]]
#: Runs argv with a timeout -> exit status, or raises OSError / TimeoutExpired.
RunStatus = Callable[[Sequence[str], float], int]


def _run_status(argv: Sequence[str], timeout: float) -> int:
    return subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False).returncode


def stage_status(model: ModelSpec) -> tuple[bool, str]:
    """The doctor's own verdict (ct200-stage status), against the model's manifest if there is
    one, so "staged" means this exact content."""
    from ct200_tools.stage.manifest import default_manifest_path  # noqa: PLC0415
    from ct200_tools.stage.status import model_status  # noqa: PLC0415

    manifest = default_manifest_path(model.name)
    verdict = model_status(model.staged, manifest=manifest if os.path.isfile(manifest) else None)
    return verdict.ok, verdict.detail


def restage_command(model: ModelSpec) -> str:
    """The command that restages a damaged copy of ``model`` from its persistent copy: the
    stager's owned-target replace (verified, then swapped in atomically)."""
    return f"ct200-stage stage {model.name} --spec /etc/ct200/site.yml --replace"


def find_program(name: str) -> str | None:
    """Where systemd finds a bare ExecStart= name: its fixed search path, not $PATH."""
    return engines.resolve_program(
        name, lambda path: os.path.isfile(path) and os.access(path, os.X_OK)
    )


class Preflight:
    def __init__(
        self,
        site: SiteSpec,
        server: ServerSpec,
        systemd: Systemd | None = None,
        staged: StageStatus = stage_status,
        run: RunStatus = _run_status,
    ) -> None:
        self.site = site
        self.server = server
        self.systemd = systemd or Systemd()
        self.staged = staged
        self.run = run
        self.where = f"servers[{site.servers.index(server)}]"

    def problems(self) -> list[Problem]:
        found = self.program()
        found += self.config()
        found += self.models()
        found += self.devices()
        return found

    # -- the engine -----------------------------------------------------------------------------

    def program(self) -> list[Problem]:
        s = self.server
        path = engines.program(s)
        kind = engines.kind(s)
        what, _ = kind.missing_fix(s, self.where, path)
        if kind.module is None:  # the program is the server itself
            what = f"install the server's program there, or correct {self.where}.command[0]"
            if "/" not in path:
                if find_program(path) is None:
                    dirs = engines.SYSTEMD_PATH_TEXT
                    return [
                        Problem(
                            "engine",
                            f"{path} is not in systemd's search path ({dirs})",
                            f"give its absolute path in {self.where}.command[0], or install it "
                            "in /usr/local/bin",
                        )
                    ]
                return []
            return self._executable(path, what)
        venv = s.env.get("VIRTUAL_ENV")
        fix = f"{what}; {READABLE}" if venv else what
        problems = self._executable(path, fix)
        return problems or self._module(path, venv)

    def _executable(self, path: str, fix: str) -> list[Problem]:
        if not os.path.exists(path):
            return [Problem("engine", f"{path} does not exist (or is hidden from it)", fix)]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return [Problem("engine", f"{path} is not an executable file for this user", fix)]
        return []

    def _module(self, python: str, venv: str | None) -> list[Problem]:
        module = engines.engine_module(self.server) or ""
        dist = engines.engine_dist(self.server) or ""
        where = f"the venv {venv}" if venv else python
        fix = (
            f"install it: {python} -m pip install {module} (or set {self.where}.env.VIRTUAL_ENV "
            f"to the venv that has it)"
        )
        try:
            status = self.run([python, "-c", FIND_MODULE, module, dist], FIND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [
                Problem("engine", f"{python} did not answer within {FIND_TIMEOUT_S:.0f} s", fix)
            ]
        except OSError as exc:
            return [Problem("engine", f"cannot run {python}: {exc.strerror or exc}", fix)]
        if status == 0:
            return []
        if status == 1:
            return [Problem("engine", f"{where} has no {module} package", fix)]
        return [Problem("engine", f"{python} failed (exit {status}) looking for {module}", fix)]

    def config(self) -> list[Problem]:
        if not engines.kind(self.server).config_file:
            return []
        path = engines.config_path(self.server.name)
        if os.access(path, os.R_OK):
            return []
        why = "is missing" if not os.path.exists(path) else "is not readable for this user"
        return [
            Problem(
                "config",
                f"{path} {why}",
                "run the container playbook, "
                f"{playbook_command('playbooks/container.yml', '--tags', 'servers')}: it "
                f"renders the file, group {engines.SERVICE_USER}",
            )
        ]

    # -- the models -----------------------------------------------------------------------------

    def models(self) -> list[Problem]:
        models = engines.models_of(self.site, self.server)
        problems: list[Problem] = []
        unstaged = [(m, why) for m in models for ok, why in [self.staged(m)] if not ok]
        units = [engines.stage_unit(m.name) for m, _ in unstaged]
        try:
            states = self.systemd.show(units)
        except SystemdError:
            states = {}
        for model, why in unstaged:
            unit = engines.stage_unit(model.name)
            state = states.get(unit)
            if os.path.lexists(model.staged):
                # A damaged copy: the unit's stage would refuse to overwrite it (or call a
                # same-size change "already staged"); the owned-target replace restages it and
                # refuses a directory ct200-stage did not make.
                how = f"`{restage_command(model)}` restages it"
                said = f"its staging unit {unit} is {state.describe() if state else 'unknown'}"
            elif state is not None and state.active == "active":
                how = f"`systemctl restart {unit}` restages it"
                said = f"its staging unit {unit} is active, so it was removed since"
            else:
                said = f"its staging unit {unit} is {state.describe() if state else 'unknown'}"
                how = f"see `journalctl -u {unit}`, fix that, then `systemctl start {unit}`"
            problems.append(
                Problem(
                    f"model {model.name}",
                    f"not staged at {model.staged}: {why}; {said}",
                    f"{how}, and start this server again",
                )
            )
        draft = self.server.speculative.draft_model if self.server.speculative else None
        declared = {m.staged for m in models}
        if draft is not None and draft not in declared and not os.path.exists(draft):
            problems.append(
                Problem(
                    "draft model",
                    f"{draft} does not exist",
                    "put the drafter there, or declare it under models (staged: this path) so "
                    "staging puts it there at every boot",
                )
            )
        return problems

    # -- the GPUs -------------------------------------------------------------------------------

    def devices(self) -> list[Problem]:
        """Only what the service user alone meets: a node's permission bits (EACCES). A missing
        node or one the container's device cgroup denies (ENOENT, EPERM, ENXIO) fails root too:
        the doctor's gate, next, names its root cause and fix."""
        if not self.server.gpus:
            return []
        problems = []
        for node in GPU_NODES:
            try:
                fd = os.open(node, os.O_RDWR)
            except PermissionError as exc:
                if exc.errno != errno.EACCES:
                    continue
                problems.append(
                    Problem(
                        f"device {node}",
                        f"user {engines.SERVICE_USER} may not open it read-write "
                        f"({exc.strerror}), though the server runs as that user",
                        f"give the node mode 0666, as the driver creates it (ls -l {node}; on "
                        "the host, NVreg_DeviceFileMode=0666, or devN's mode=0666 in the "
                        "container's config)",
                    )
                )
            except OSError:
                continue
            else:
                os.close(fd)
        return problems
