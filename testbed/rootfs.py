"""The machines' root filesystem: debootstrapped once, cached, shared read-only by all machines.

The cache key covers everything that shapes the tree (suite, packages, recipe), so a changed
recipe builds a new tree beside the old one instead of changing a tree that machines use.
A build happens in a ``.partial`` directory under a lock and is renamed into place when complete,
so a killed build leaves nothing that looks usable and the next run starts it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import platform
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from testbed import standins
from testbed.config import PACKAGES, RECIPE_VERSION, SUITE, Settings
from testbed.errors import TestbedError
from testbed.system import BUILD_TOOLS, Runner, require_tools

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
COMPLETE = ".ct200-testbed-rootfs"
#: Timers that only cost time on a throwaway machine; masked.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "console-getty.service",
    "systemd-timesyncd.service",
)
SSHD_DROPIN = """\
# ct200-tools testbed: key-only root login; the host key is made per machine at boot time.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""


def cache_key() -> str:
    recipe = {
        "suite": SUITE,
        "packages": sorted(PACKAGES),
        "recipe": RECIPE_VERSION,
        "arch": platform.machine(),
        "sshd": SSHD_DROPIN,
        "masked": MASKED_UNITS,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def path(settings: Settings) -> Path:
    return settings.cache_dir / f"rootfs-{SUITE}-{cache_key()}"


def is_built(settings: Settings) -> bool:
    return (path(settings) / COMPLETE).is_file()


@contextlib.contextmanager
def _build_lock(settings: Settings) -> Iterator[None]:
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    with (settings.cache_dir / "build.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("testbed: another run is building the rootfs; waiting for it", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def check_mirror(mirror: str, timeout: float = 15) -> None:
    url = f"{mirror}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http(s) mirror)
            resp.read(64)
    except (urllib.error.URLError, OSError) as exc:
        raise TestbedError(
            f"cannot reach the Debian mirror {mirror} ({exc}); the first (cold) build of the "
            "testbed's rootfs downloads about 100 MB from it",
            fix="check the network or proxy (http_proxy is honoured), or set CT200_TESTBED_MIRROR "
            "to a reachable Debian mirror; once built, the cache needs no network",
        ) from exc


def ensure(settings: Settings, runner: Runner, rebuild: bool = False) -> tuple[Path, float]:
    """The cached rootfs, built when missing; returns it and the seconds spent building (0)."""
    target = path(settings)
    if is_built(settings) and not rebuild:
        return target, 0.0
    if rebuild and str(target) in Path("/proc/self/mountinfo").read_text():
        raise TestbedError(
            f"cannot rebuild {target}: running testbed machines use it",
            fix="`python -m testbed down --all` first",
        )
    with _build_lock(settings):
        if is_built(settings) and not rebuild:  # another run built it while we waited
            return target, 0.0
        started = time.monotonic()
        _build(settings, runner, target)
        return target, time.monotonic() - started


def _build(settings: Settings, runner: Runner, target: Path) -> None:
    require_tools(BUILD_TOOLS)
    if not KEYRING.is_file():
        raise TestbedError(
            f"{KEYRING} is missing: debootstrap cannot check the Debian archive's signatures",
            fix="apt-get install -y debian-archive-keyring",
        )
    check_mirror(settings.mirror)
    partial = target.with_name(target.name + ".partial")
    if partial.exists():
        print(f"testbed: removing the unfinished build {partial} of an earlier run", flush=True)
        shutil.rmtree(partial)
    print(f"testbed: building the rootfs cache {target} from {settings.mirror} (about a minute)")
    log = target.with_name(target.name + ".log")
    proc = runner.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            f"--keyring={KEYRING}",
            SUITE,
            partial,
            settings.mirror,
        ],
        check=False,
        timeout=1200,
    )
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise TestbedError(
            f"debootstrap failed (exit {proc.returncode}); full log: {log}",
            detail=(proc.stdout + proc.stderr)[-1500:],
            fix="a network error: run it again; a package error: check CT200_TESTBED_MIRROR",
        )
    _finish(partial)
    if target.exists():  # --rebuild of a tree that no machine may be using
        shutil.rmtree(target)
    partial.rename(target)
    _prune(settings, keep=target)


def _finish(root: Path) -> None:
    """Make the tree a template: nothing machine-specific, nothing that costs boot time."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    (root / "etc" / "hostname").unlink(missing_ok=True)
    (root / "etc" / "ssh" / "sshd_config.d" / "ct200-testbed.conf").write_text(SSHD_DROPIN)
    units = root / "etc" / "systemd" / "system"
    for unit in MASKED_UNITS:
        link = units / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (root / cache).glob("*"):
            if item.is_file():
                item.unlink()
    ssh = root / "root" / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    marker = root / "etc" / "ct200-testbed"
    marker.mkdir(exist_ok=True)
    (marker / "README").write_text(standins.MACHINE_README)
    (root / COMPLETE).write_text(json.dumps({"key": cache_key(), "built": time.time()}) + "\n")


def _prune(settings: Settings, keep: Path) -> None:
    """Old trees of earlier recipes, unless a machine still has one mounted."""
    mounts = Path("/proc/self/mountinfo").read_text()
    for old in settings.cache_dir.glob(f"rootfs-{SUITE}-*"):
        if old == keep or old.name.startswith(keep.name) or str(old) in mounts:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)  # the build log of an old tree
