"""roles/model_staging on the testbed: boot-time staging units for models the test creates.

As a user would, the test first puts persistent copies on the `ct` machine (small trees shaped
like safetensors checkpoints under /tank/models), then converges the site with those models in
the spec (an extra-vars file: the committed testbed spec plus `models`), and checks the units,
the staged trees and the untouched sources on the machine. One fixture runs the whole sequence
in order, phase by phase; each test asserts one part of it.

The testbed is shared by the session (the container converged with the committed spec by the
session's shared converge, tests/testbed/conftest.py): this module runs the playbooks on the
container only (and validation on the controller), ends by converging the committed spec (no
models: the role retires the units), and its finalizer removes what it and the staging role added
to the container.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import REPO, AnsibleRun, Bed, diff, snapshot

from testbed import units
from testbed.machine import hostname

pytestmark = pytest.mark.testbed

SITE = "playbooks/site.yml"
CONTAINER = "playbooks/container.yml"
CT = hostname("ct")
#: The container and the controller's validation only: the host is no part of staging.
LIMIT = ("--limit", f"{CT},localhost")
#: The servers of SiteBuilder's specs are there to make their models needed; they are SGLang
#: servers on GPUs the testbed lacks, so their units stay out of this module (test_servers.py
#: runs servers). Passed on every run.
NO_SERVERS = ("-e", "inference_servers_enabled=false")
STAGE = "/opt/ct200/venv/bin/ct200-stage"
MANIFESTS = "/var/lib/ct200/manifests"
TEMPLATE = "/etc/systemd/system/ct200-stage@.service"


@dataclass(frozen=True)
class Model:
    """A model of the test: its spec entry, and the files of its persistent copy (relative path
    -> payload bytes of a safetensors shard, odd sizes on purpose, or None for a small JSON)."""

    name: str
    files: Mapping[str, int | None]
    staged_at: str = ""

    @property
    def source(self) -> str:
        return f"/tank/models/{self.name}"

    @property
    def staged(self) -> str:
        return self.staged_at or f"/dev/shm/models/{self.name}"

    def entry(self) -> dict[str, str]:
        return {"name": self.name, "source": self.source, "staged": self.staged}


TINY = Model(
    "tb-tiny",
    {
        "config.json": None,
        "model.safetensors.index.json": None,
        "model-00001-of-00002.safetensors": 3 * 2**20 + 4098,
        "model-00002-of-00002.safetensors": 2 * 2**20 + 2,
    },
)
DRAFT = Model("tb-tiny-draft", {"config.json": None, "model.safetensors": 2**20 + 510})
#: The models the site converges with; their persistent copies are written by MAKE_SOURCES.
MODELS = (TINY, DRAFT)
#: Never written: its persistent copy is missing.
MISSING = Model("tb-missing", {}, staged_at="/dev/shm/models/m")
#: A sparse 1 TiB shard (written by truncate): no real bytes, but larger than any /dev/shm here.
HUGE = Model("tb-huge", {"x": 2**40})


class SiteBuilder:
    """The extra-vars files the tests converge with: the committed testbed spec with the given
    models, each main model served by one server on its own (declared) GPU and the drafter as
    tb-tiny's DFLASH draft model, so that the role stages every listed model."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    @staticmethod
    def site(models: Sequence[Model]) -> dict[str, Any]:
        site: dict[str, Any] = yaml.safe_load(
            (REPO / "inventory/testbed/group_vars/all.yml").read_text()
        )
        spec = site["ct200_site"]
        spec["models"] = [m.entry() for m in models]
        mains = [m for m in models if m is not DRAFT]
        spec["gpus"]["count"] = max(1, len(mains))
        spec["servers"] = []
        for i, m in enumerate(mains):
            server: dict[str, Any] = {
                "name": f"srv-{m.name}",
                "engine": "sglang",
                "model": m.name,
                "gpus": [i],
                "port": 30000 + i,
            }
            if m is TINY and DRAFT in models:
                server["speculative"] = {"algorithm": "DFLASH", "draft_model": DRAFT.staged}
            spec["servers"].append(server)
        return site

    def extra_vars(self, label: str, *models: Model) -> str:
        """``@FILE`` for ``ansible-playbook -e``."""
        path = self.workdir / f"staging-{label}.yml"
        path.write_text(yaml.safe_dump(self.site(models), sort_keys=False))
        return f"@{path}"


#: Writes the persistent copies (argv[1]: JSON {source: {relpath: size or null}}): each shard is
#: a safetensors file (8-byte header length, JSON header, F16 data); timestamps set in the past.
MAKE_SOURCES = r"""
import json, os, struct, sys
for root, files in json.loads(sys.argv[1]).items():
    os.makedirs(root)
    for rel, size in files.items():
        path = os.path.join(root, rel)
        with open(path, "wb") as fh:
            if size is None:
                fh.write(json.dumps({"model": os.path.basename(root), "file": rel}).encode())
            else:
                header = json.dumps({"__metadata__": {"format": "pt"},
                                     "w": {"dtype": "F16", "shape": [size // 2],
                                           "data_offsets": [0, size // 2 * 2]}}).encode()
                fh.write(struct.pack("<Q", len(header)) + header)
                left = size
                while left:
                    fh.write(os.urandom(min(left, 1 << 20)))
                    left -= min(left, 1 << 20)
        os.utime(path, (1_600_000_000, 1_600_000_000))
"""

#: Every entry under the given trees: type, size, mode, owner, mtime, ctime, sha256 (as JSON).
LISTING = r"""
import hashlib, json, os, stat, sys
out = {}
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for path in [root] + [os.path.join(root, f) for f in sorted(files)]:
            st = os.lstat(path)
            entry = {"mode": oct(st.st_mode), "uid": st.st_uid, "size": st.st_size,
                     "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    entry["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
            out[path] = entry
print(json.dumps(out))
"""

SHOW = [
    "ActiveState",
    "SubState",
    "Result",
    "UnitFileState",
    "TimeoutStartUSec",
    "RequiresMountsFor",
    "After",
    "WantedBy",
    "ExecMainStartTimestampMonotonic",
    "ExecMainExitTimestampMonotonic",
]


def unit(name: str) -> str:
    return f"ct200-stage@{name}.service"


def show(bed: Bed, name: str) -> dict[str, str]:
    proc = bed.ssh("ct", "systemctl", "show", f"--property={','.join(SHOW)}", unit(name))
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def listing(bed: Bed, *tops: str) -> dict[str, dict[str, Any]]:
    proc = bed.ssh("ct", "python3", "-c", LISTING, *tops)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def read_json(bed: Bed, path: str) -> dict[str, Any]:
    """The file's JSON, or {"missing": stderr}: the tests, not the fixture, judge it."""
    proc = bed.ssh("ct", "cat", path)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {"missing": proc.stderr}


def verify_staged(bed: Bed, model: Model) -> tuple[int, str]:
    proc = bed.ssh("ct", STAGE, "verify", model.staged)
    return proc.returncode, proc.stdout + proc.stderr


# -- the sequence, phase by phase: each phase records what the tests judge ----------------------


def write_sources(bed: Bed) -> dict[str, dict[str, Any]]:
    """The persistent copies, as a user would put them there; returns their listing."""
    made = bed.ssh(
        "ct", "python3", "-c", MAKE_SOURCES, json.dumps({m.source: m.files for m in MODELS})
    )
    assert made.returncode == 0, made.stderr
    (shard,) = HUGE.files
    sparse = bed.ssh(
        "ct", "sh", "-ec", f"mkdir {HUGE.source}; truncate -s {HUGE.files[shard]} {HUGE.source}/x"
    )
    assert sparse.returncode == 0, sparse.stderr
    return listing(bed, *(m.source for m in MODELS))


@dataclass(frozen=True)
class Converge:
    """--check on the fresh container, the converge, a second run, --check again."""

    fresh: dict[str, str]
    check_fresh: AnsibleRun
    after_check_fresh: dict[str, str]
    shm_after_check: str
    run: AnsibleRun
    converged: dict[str, str]
    second: AnsibleRun
    check_after: AnsibleRun

    @classmethod
    def record(cls, bed: Bed, models: str) -> Converge:
        fresh = snapshot(bed, "ct")
        check_fresh = bed.ansible(SITE, *LIMIT, *NO_SERVERS, "-e", models, "--check", "--diff")
        after_check_fresh = snapshot(bed, "ct")
        shm_after_check = bed.ssh("ct", "ls", "-A", "/dev/shm").stdout
        run = bed.ansible(SITE, *LIMIT, *NO_SERVERS, "-e", models)
        converged = snapshot(bed, "ct")
        second = bed.ansible(SITE, *LIMIT, *NO_SERVERS, "-e", models)
        check_after = bed.ansible(SITE, *LIMIT, *NO_SERVERS, "-e", models, "--check", "--diff")
        return cls(
            fresh,
            check_fresh,
            after_check_fresh,
            shm_after_check,
            run,
            converged,
            second,
            check_after,
        )


@dataclass(frozen=True)
class Staged:
    """The converged container: units, the template and a drop-in, tb-tiny's staged tree."""

    units: dict[str, dict[str, str]]
    dropin: str
    template: str
    marker: dict[str, Any]
    manifest: dict[str, Any]
    tree: dict[str, dict[str, Any]]
    verify: tuple[int, str]

    @classmethod
    def record(cls, bed: Bed) -> Staged:
        dropin = f"/etc/systemd/system/{unit(DRAFT.name)}.d/ct200-model.conf"
        return cls(
            units={m.name: show(bed, m.name) for m in MODELS},
            dropin=bed.ssh("ct", "cat", dropin).stdout,
            template=bed.ssh("ct", "cat", TEMPLATE).stdout,
            marker=read_json(bed, f"{TINY.staged}/.ct200-staged"),
            manifest=read_json(bed, f"{MANIFESTS}/{TINY.name}.json"),
            tree=listing(bed, TINY.staged),
            verify=verify_staged(bed, TINY),
        )


@dataclass(frozen=True)
class Reboot:
    """A reboot, short of rebooting: the units inactive and /dev/shm empty, then what boot does,
    starting multi-user.target, which wants every enabled staging unit."""

    units: dict[str, dict[str, str]]
    marker: dict[str, Any]
    verify: tuple[int, str]

    @classmethod
    def record(cls, bed: Bed) -> Reboot:
        names = [unit(m.name) for m in reversed(MODELS)]
        boot = bed.ssh(
            "ct", "sh", "-ec", f"systemctl stop {' '.join(names)}; rm -rf /dev/shm/models"
        )
        assert boot.returncode == 0, boot.stderr
        boot = bed.ssh("ct", "systemctl", "start", "multi-user.target", timeout=300)
        assert boot.returncode == 0, boot.stderr
        return cls(
            units={m.name: show(bed, m.name) for m in MODELS},
            marker=read_json(bed, f"{TINY.staged}/.ct200-staged"),
            verify=verify_staged(bed, TINY),
        )


@dataclass(frozen=True)
class Failures:
    """A model whose persistent copy is missing (the whole container play: nothing changed), and
    a model that does not fit (the unit fails and the play reports its journal)."""

    before_missing: dict[str, str]
    missing: AnsibleRun
    after_missing: dict[str, str]
    units_after_missing: dict[str, dict[str, str]]
    huge: AnsibleRun
    huge_unit: dict[str, str]

    @classmethod
    def record(cls, bed: Bed, site: SiteBuilder) -> Failures:
        before_missing = snapshot(bed, "ct")
        missing = bed.ansible(
            CONTAINER, *NO_SERVERS, "-e", site.extra_vars("missing", *MODELS, MISSING)
        )
        after_missing = snapshot(bed, "ct")
        units_after_missing = {m.name: show(bed, m.name) for m in MODELS}
        huge = bed.ansible(
            CONTAINER, "-e", site.extra_vars("huge", *MODELS, HUGE), "--tags", "staging"
        )
        return cls(
            before_missing,
            missing,
            after_missing,
            units_after_missing,
            huge,
            show(bed, HUGE.name),
        )


@dataclass(frozen=True)
class Retire:
    """The committed spec again, without these models: their units are retired."""

    run: AnsibleRun
    units: dict[str, dict[str, str]]
    dropins: str
    staged: str

    @classmethod
    def record(cls, bed: Bed) -> Retire:
        run = bed.ansible(SITE, *LIMIT, *NO_SERVERS)
        return cls(
            run,
            units={m.name: show(bed, m.name) for m in (*MODELS, HUGE)},
            dropins=bed.ssh(
                "ct", "sh", "-c", "ls -d /etc/systemd/system/ct200-stage@*.service.d 2>/dev/null"
            ).stdout,
            staged=bed.ssh("ct", "ls", "-A", "/dev/shm/models").stdout,
        )


@dataclass(frozen=True)
class Staging:
    bed: Bed
    sources_made: dict[str, dict[str, Any]]
    converge: Converge
    staged: Staged
    reboot: Reboot
    failures: Failures
    retire: Retire
    sources_end: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def staging(testbed: Bed) -> Iterator[Staging]:
    bed = testbed
    site = SiteBuilder(bed.workdir)
    try:
        # The session's shared converge installed the staging template (models: []); taken away
        # first, so that test_rendered_units_verify_clean sees this converge add it and verifies
        # it with the models' instances. The finalizer removes it again.
        gone = bed.ssh("ct", "sh", "-ec", f"rm -f {TEMPLATE}; systemctl daemon-reload")
        assert gone.returncode == 0, gone.stderr
        sources_made = write_sources(bed)
        converge = Converge.record(bed, site.extra_vars("models", *MODELS))
        staged = Staged.record(bed)
        reboot = Reboot.record(bed)
        failures = Failures.record(bed, site)
        retire = Retire.record(bed)
        sources_end = listing(bed, *(m.source for m in MODELS))
        yield Staging(bed, sources_made, converge, staged, reboot, failures, retire, sources_end)
    finally:
        # Back to the machine the playbooks leave: no test models, units, drop-ins, manifests.
        bed.ssh(
            "ct",
            "sh",
            "-c",
            "systemctl stop 'ct200-stage@*.service';"
            " systemctl reset-failed 'ct200-stage@*.service';"
            " rm -rf /tank /dev/shm/models /var/lib/ct200 /etc/systemd/system/ct200-stage@*"
            " /etc/systemd/system/ct200-boot-report.service"
            " /etc/systemd/system/*.wants/ct200-boot-report.service;"
            " systemctl daemon-reload",
        )


def test_site_builder_serves_every_model() -> None:
    """The builder's spec needs every model it lists (the role stages only what servers use)."""
    spec = SiteBuilder.site([*MODELS, HUGE])["ct200_site"]
    assert [m["name"] for m in spec["models"]] == ["tb-tiny", "tb-tiny-draft", "tb-huge"]
    assert spec["gpus"]["count"] == 2
    assert [(s["model"], s["gpus"], s["port"]) for s in spec["servers"]] == [
        ("tb-tiny", [0], 30000),
        ("tb-huge", [1], 30001),
    ]
    assert spec["servers"][0]["speculative"] == {
        "algorithm": "DFLASH",
        "draft_model": "/dev/shm/models/tb-tiny-draft",
    }
    assert SiteBuilder.site([])["ct200_site"]["servers"] == []


def test_check_mode_on_fresh_machine_changes_and_starts_nothing(staging: Staging) -> None:
    run = staging.converge.check_fresh
    assert run.rc == 0, run.describe()
    changes = diff(staging.converge.fresh, staging.converge.after_check_fresh)
    assert not changes, "--check changed ct:\n" + "\n".join(changes)
    assert "models" not in staging.converge.shm_after_check.split(), "--check staged a model"


def test_converge(staging: Staging) -> None:
    run = staging.converge.run
    assert run.rc == 0, run.describe()
    assert run.stats[CT]["failures"] == 0 and run.stats[CT]["changed"] > 0, run.describe()


def test_second_run_changes_nothing(staging: Staging) -> None:
    run = staging.converge.second
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "not idempotent:\n" + run.describe()


def test_check_mode_after_converge_reports_no_changes(staging: Staging) -> None:
    run = staging.converge.check_after
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "--check is not truthful on a converged machine:\n" + run.describe()


@pytest.mark.parametrize("name", [m.name for m in MODELS])
def test_unit_active_exited_enabled(staging: Staging, name: str) -> None:
    state = staging.staged.units[name]
    assert (state["ActiveState"], state["SubState"], state["Result"]) == (
        "active",
        "exited",
        "success",
    ), state
    assert state["UnitFileState"] == "enabled", state
    assert "multi-user.target" in state["WantedBy"].split(), state
    assert "local-fs.target" in state["After"].split(), state
    source, staged = f"/tank/models/{name}", f"/dev/shm/models/{name}"
    assert set(state["RequiresMountsFor"].split()) == {source, str(Path(staged).parent)}, state
    # The floor: these models are a few MB.
    assert state["TimeoutStartUSec"] == "5min", state


def test_units_in_spec_order(staging: Staging) -> None:
    """Each stage waits for the one before it (whole disk bandwidth, honest capacity checks)."""
    assert unit("tb-tiny") in staging.staged.units["tb-tiny-draft"]["After"].split()
    assert unit("tb-tiny-draft") not in staging.staged.units["tb-tiny"]["After"].split()
    assert f"After={unit('tb-tiny')}" in staging.staged.dropin


def test_unit_runs_ct200_stage_from_the_venv(staging: Staging) -> None:
    exec_start = next(
        line for line in staging.staged.template.splitlines() if line.startswith("ExecStart=")
    )
    assert exec_start == (
        f"ExecStart={STAGE} stage %i --spec /etc/ct200/site.yml "
        f"--manifest {MANIFESTS}/%i.json --create-manifest"
    )
    for line in ("Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target"):
        assert line in staging.staged.template.splitlines()


def test_staged_tree_marked_and_verified(staging: Staging) -> None:
    assert staging.staged.marker["kind"] == "ct200-stage-marker", staging.staged.marker
    assert staging.staged.marker["source"] == "/tank/models/tb-tiny", staging.staged.marker
    assert staging.staged.marker["manifest_digest"] == staging.staged.manifest["digest"]
    rc, out = staging.staged.verify
    assert rc == 0, out
    # Byte for byte the source's files (the tree adds only its own .ct200- files).
    src = {
        p.removeprefix("/tank/models/tb-tiny"): e.get("sha256")
        for p, e in staging.sources_made.items()
        if p == "/tank/models/tb-tiny" or p.startswith("/tank/models/tb-tiny/")
    }
    dst = {
        p.removeprefix("/dev/shm/models/tb-tiny"): e.get("sha256")
        for p, e in staging.staged.tree.items()
        if "/.ct200-" not in p
    }
    assert dst == src


def test_boot_restages_from_the_persistent_copy(staging: Staging) -> None:
    for name, state in staging.reboot.units.items():
        assert (state["ActiveState"], state["SubState"], state["Result"]) == (
            "active",
            "exited",
            "success",
        ), (name, state)
    assert staging.reboot.marker["staged_at"] != staging.staged.marker["staged_at"]
    assert staging.reboot.marker["manifest_digest"] == staging.staged.manifest["digest"]
    rc, out = staging.reboot.verify
    assert rc == 0, out
    # One at a time: the drafter's stage began after the first model's had ended.
    first, second = staging.reboot.units["tb-tiny"], staging.reboot.units["tb-tiny-draft"]
    assert int(second["ExecMainStartTimestampMonotonic"]) >= int(
        first["ExecMainExitTimestampMonotonic"]
    )


def test_sources_never_touched(staging: Staging) -> None:
    """Bytes, sizes, modes, owners, mtimes and ctimes of every file and directory of each
    persistent copy, after converge, re-runs, a restage, a failed run and retirement."""
    assert staging.sources_end == staging.sources_made


def test_missing_source_fails_before_any_change(staging: Staging) -> None:
    run = staging.failures.missing
    assert run.rc != 0, run.describe()
    assert run.stats[CT]["failures"] == 1 and run.stats[CT]["changed"] == 0, run.describe()
    failed = run.results("failed")
    assert failed and "persistent copy is a directory" in failed[0], run.describe()
    assert "model tb-missing: its persistent copy /tank/models/tb-missing does not exist" in (
        " ".join(run.output.split())
    ), run.describe()
    changes = diff(staging.failures.before_missing, staging.failures.after_missing)
    assert not changes, "a failed preflight changed ct:\n" + "\n".join(changes)
    assert staging.failures.units_after_missing == staging.reboot.units


def test_model_that_does_not_fit_fails_with_its_journal(staging: Staging) -> None:
    run = staging.failures.huge
    assert run.rc != 0, run.describe()
    assert run.stats[CT]["rescued"] == 1, run.describe()
    output = " ".join(run.output.split())
    assert "model tb-huge does not fit" in output, run.describe()
    assert staging.failures.huge_unit["ActiveState"] == "failed", staging.failures.huge_unit
    # The timeout follows the size: 1 TiB at 1 GB/s is 1100 s, rounded up to whole minutes.
    assert staging.failures.huge_unit["TimeoutStartUSec"] == "19min", staging.failures.huge_unit


def test_models_removed_from_the_spec_are_retired(staging: Staging) -> None:
    run = staging.retire.run
    assert run.rc == 0, run.describe()
    for name, state in staging.retire.units.items():
        assert state["UnitFileState"] == "disabled", (name, state)
        assert state["ActiveState"] == "inactive", (name, state)
    # The role's drop-ins and their directories are gone (nothing else was in them).
    assert staging.retire.dropins.split() == [], staging.retire.dropins
    # Retiring a unit leaves its staged copy: only a reboot or a person frees that RAM.
    assert set(staging.retire.staged.split()) >= {m.name for m in MODELS}


def test_rendered_units_verify_clean(staging: Staging) -> None:
    """systemd-analyze verify, failing on any stderr, on every unit the converge added or
    changed: the template and each model's instance (with its drop-in)."""
    touched = [
        p
        for p in staging.converge.converged
        if staging.converge.converged[p] != staging.converge.fresh.get(p)
    ]
    rendered = [u for u in units.units_of(touched) if u.startswith(units.UNIT_DIRS)]
    expected = {TEMPLATE} | {f"/etc/systemd/system/{unit(n)}" for n in (m.name for m in MODELS)}
    assert expected <= set(rendered), rendered

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        proc = staging.bed.ssh("ct", *argv)
        return proc.returncode, proc.stdout, proc.stderr

    problems = units.verify(rendered, run)
    assert not problems, "\n".join(map(str, problems))
