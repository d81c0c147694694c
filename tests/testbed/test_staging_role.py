"""roles/model_staging on the testbed: boot-time staging units for models the test creates.

As a user would, the test first puts persistent copies on the `ct` machine (small trees shaped
like safetensors checkpoints under /tank/models), then converges the site with those models in
the spec (an extra-vars file: the committed testbed spec plus `models`), and checks the units,
the staged trees and the untouched sources on the machine. One fixture runs the whole sequence
in order; each test asserts one part of it.

The testbed is shared by the session, and test_testbed_playbooks.py expects machines that no
playbook has run on: this module runs the playbooks on the container only (and validation on the
controller), ends by converging the committed spec (no models: the role retires the units), and
its finalizer removes what it and the staging role added to the container.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tbharness import REPO, AnsibleRun, Bed
from test_testbed_playbooks import diff, snapshot

from ct200_tools.testbed import units
from ct200_tools.testbed.machine import hostname

pytestmark = pytest.mark.testbed

SITE = "playbooks/site.yml"
CONTAINER = "playbooks/container.yml"
CT = hostname("ct")
#: The container and the controller's validation only: the host is no part of staging, and the
#: playbook tests after this module expect a host no playbook has run on yet.
LIMIT = ("--limit", f"{CT},localhost")
STAGE = "/opt/ct200/venv/bin/ct200-stage"
MANIFESTS = "/var/lib/ct200/manifests"
TEMPLATE = "/etc/systemd/system/ct200-stage@.service"

#: name -> files of its persistent copy: relative path -> payload bytes (a shard's tensor data,
#: odd sizes on purpose) or None for a small JSON file.
TREES: dict[str, dict[str, int | None]] = {
    "tb-tiny": {
        "config.json": None,
        "model.safetensors.index.json": None,
        "model-00001-of-00002.safetensors": 3 * 2**20 + 4098,
        "model-00002-of-00002.safetensors": 2 * 2**20 + 2,
    },
    "tb-tiny-draft": {"config.json": None, "model.safetensors": 2**20 + 510},
}
MODELS = [
    {"name": name, "source": f"/tank/models/{name}", "staged": f"/dev/shm/models/{name}"}
    for name in TREES
]
MISSING = {"name": "tb-missing", "source": "/tank/models/tb-missing", "staged": "/dev/shm/models/m"}
#: A sparse 1 TiB shard: no real bytes, but larger than any /dev/shm here.
HUGE = {"name": "tb-huge", "source": "/tank/models/tb-huge", "staged": "/dev/shm/models/tb-huge"}

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


def spec_vars(bed: Bed, label: str, models: list[dict[str, Any]]) -> str:
    """An extra-vars file: the committed testbed spec with these models."""
    site = yaml.safe_load((REPO / "inventory/testbed/group_vars/all.yml").read_text())
    spec = site["ct200_site"]
    spec["models"] = models
    # The role stages what enabled servers serve: one server per model, on its own (declared)
    # GPU, and the drafter as tb-tiny's DFLASH draft model, so every listed model is needed.
    names = [m["name"] for m in models]
    mains = [m for m in models if m["name"] != "tb-tiny-draft"]
    spec["gpus"]["count"] = max(1, len(mains))
    spec["servers"] = []
    for i, m in enumerate(mains):
        server: dict[str, Any] = {
            "name": f"srv-{m['name']}",
            "engine": "sglang",
            "model": m["name"],
            "gpus": [i],
            "port": 30000 + i,
        }
        if m["name"] == "tb-tiny" and "tb-tiny-draft" in names:
            server["speculative"] = {
                "algorithm": "DFLASH",
                "draft_model": "/dev/shm/models/tb-tiny-draft",
            }
        spec["servers"].append(server)
    path = Path(bed.workdir) / f"staging-{label}.yml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return f"@{path}"


@dataclass
class Staging:
    bed: Bed
    sources_made: dict[str, dict[str, Any]]
    fresh: dict[str, str]
    check_fresh: AnsibleRun
    after_check_fresh: dict[str, str]
    shm_after_check: str
    converge: AnsibleRun
    converged: dict[str, str]
    second: AnsibleRun
    check_after: AnsibleRun
    units: dict[str, dict[str, str]]
    dropin: str
    template: str
    marker: dict[str, Any]
    manifest: dict[str, Any]
    staged: dict[str, dict[str, Any]]
    verify: tuple[int, str]
    reboot: dict[str, dict[str, str]]
    marker_after_reboot: dict[str, Any]
    verify_after_reboot: tuple[int, str]
    before_missing: dict[str, str]
    missing: AnsibleRun
    after_missing: dict[str, str]
    units_after_missing: dict[str, dict[str, str]]
    huge: AnsibleRun
    huge_unit: dict[str, str]
    retire: AnsibleRun
    retired: dict[str, dict[str, str]]
    retired_dropins: str
    staged_after_retire: str
    sources_end: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def staging(testbed: Bed) -> Iterator[Staging]:
    bed = testbed
    sources = {m["source"]: TREES[m["name"]] for m in MODELS}
    models = spec_vars(bed, "models", MODELS)
    try:
        made = bed.ssh("ct", "python3", "-c", MAKE_SOURCES, json.dumps(sources))
        assert made.returncode == 0, made.stderr
        sparse = bed.ssh(
            "ct", "sh", "-ec", f"mkdir {HUGE['source']}; truncate -s 1T {HUGE['source']}/x"
        )
        assert sparse.returncode == 0, sparse.stderr
        sources_made = listing(bed, *sources)

        fresh = snapshot(bed, "ct")
        check_fresh = bed.ansible(SITE, *LIMIT, "-e", models, "--check", "--diff")
        after_check_fresh = snapshot(bed, "ct")
        shm_after_check = bed.ssh("ct", "ls", "-A", "/dev/shm").stdout
        converge = bed.ansible(SITE, *LIMIT, "-e", models)
        converged = snapshot(bed, "ct")
        second = bed.ansible(SITE, *LIMIT, "-e", models)
        check_after = bed.ansible(SITE, *LIMIT, "-e", models, "--check", "--diff")

        tiny = "/dev/shm/models/tb-tiny"
        state = {m["name"]: show(bed, m["name"]) for m in MODELS}
        dropin = bed.ssh(
            "ct", "cat", f"/etc/systemd/system/{unit('tb-tiny-draft')}.d/ct200-model.conf"
        )
        template = bed.ssh("ct", "cat", TEMPLATE).stdout
        marker = read_json(bed, f"{tiny}/.ct200-staged")
        manifest = read_json(bed, f"{MANIFESTS}/tb-tiny.json")
        staged = listing(bed, tiny)
        proc = bed.ssh("ct", STAGE, "verify", tiny)
        verify = (proc.returncode, proc.stdout + proc.stderr)

        # A reboot, short of rebooting: the units inactive and /dev/shm empty, then what boot
        # does, starting multi-user.target, which wants every enabled staging unit.
        names = [unit(m["name"]) for m in reversed(MODELS)]
        boot = bed.ssh(
            "ct", "sh", "-ec", f"systemctl stop {' '.join(names)}; rm -rf /dev/shm/models"
        )
        assert boot.returncode == 0, boot.stderr
        boot = bed.ssh("ct", "systemctl", "start", "multi-user.target", timeout=300)
        assert boot.returncode == 0, boot.stderr
        reboot = {m["name"]: show(bed, m["name"]) for m in MODELS}
        marker_after_reboot = read_json(bed, f"{tiny}/.ct200-staged")
        proc = bed.ssh("ct", STAGE, "verify", tiny)
        verify_after_reboot = (proc.returncode, proc.stdout + proc.stderr)

        # A model whose persistent copy is missing: the whole container play, nothing changed.
        before_missing = snapshot(bed, "ct")
        missing = bed.ansible(CONTAINER, "-e", spec_vars(bed, "missing", [*MODELS, MISSING]))
        after_missing = snapshot(bed, "ct")
        units_after_missing = {m["name"]: show(bed, m["name"]) for m in MODELS}

        # A model that does not fit: the unit fails and the play reports its journal.
        huge = bed.ansible(
            CONTAINER, "-e", spec_vars(bed, "huge", [*MODELS, HUGE]), "--tags", "staging"
        )
        huge_unit = show(bed, "tb-huge")

        # The committed spec again, without these models: their units are retired.
        retire = bed.ansible(SITE, *LIMIT)
        retired = {n: show(bed, n) for n in [*TREES, "tb-huge"]}
        retired_dropins = bed.ssh(
            "ct", "sh", "-c", "ls -d /etc/systemd/system/ct200-stage@*.service.d 2>/dev/null"
        ).stdout
        staged_after_retire = bed.ssh("ct", "ls", "-A", "/dev/shm/models").stdout
        sources_end = listing(bed, *sources)
        yield Staging(
            bed,
            sources_made,
            fresh,
            check_fresh,
            after_check_fresh,
            shm_after_check,
            converge,
            converged,
            second,
            check_after,
            state,
            dropin.stdout,
            template,
            marker,
            manifest,
            staged,
            verify,
            reboot,
            marker_after_reboot,
            verify_after_reboot,
            before_missing,
            missing,
            after_missing,
            units_after_missing,
            huge,
            huge_unit,
            retire,
            retired,
            retired_dropins,
            staged_after_retire,
            sources_end,
        )
    finally:
        # Back to the machine the playbooks leave: no test models, units, drop-ins, manifests.
        bed.ssh(
            "ct",
            "sh",
            "-c",
            "systemctl stop 'ct200-stage@*.service';"
            " systemctl reset-failed 'ct200-stage@*.service';"
            " rm -rf /tank /dev/shm/models /var/lib/ct200 /etc/systemd/system/ct200-stage@*;"
            " systemctl daemon-reload",
        )


def test_check_mode_on_fresh_machine_changes_and_starts_nothing(staging: Staging) -> None:
    run = staging.check_fresh
    assert run.rc == 0, run.describe()
    changes = diff(staging.fresh, staging.after_check_fresh)
    assert not changes, "--check changed ct:\n" + "\n".join(changes)
    assert "models" not in staging.shm_after_check.split(), "--check staged a model"


def test_converge(staging: Staging) -> None:
    run = staging.converge
    assert run.rc == 0, run.describe()
    assert run.stats[CT]["failures"] == 0 and run.stats[CT]["changed"] > 0, run.describe()


def test_second_run_changes_nothing(staging: Staging) -> None:
    run = staging.second
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "not idempotent:\n" + run.describe()


def test_check_mode_after_converge_reports_no_changes(staging: Staging) -> None:
    run = staging.check_after
    assert run.rc == 0, run.describe()
    changed = {host: s["changed"] for host, s in run.stats.items() if s["changed"]}
    assert not changed, "--check is not truthful on a converged machine:\n" + run.describe()


@pytest.mark.parametrize("name", list(TREES))
def test_unit_active_exited_enabled(staging: Staging, name: str) -> None:
    state = staging.units[name]
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
    assert unit("tb-tiny") in staging.units["tb-tiny-draft"]["After"].split()
    assert unit("tb-tiny-draft") not in staging.units["tb-tiny"]["After"].split()
    assert f"After={unit('tb-tiny')}" in staging.dropin


def test_unit_runs_ct200_stage_from_the_venv(staging: Staging) -> None:
    exec_start = next(
        line for line in staging.template.splitlines() if line.startswith("ExecStart=")
    )
    assert exec_start == (
        f"ExecStart={STAGE} stage %i --spec /etc/ct200/site.yml "
        f"--manifest {MANIFESTS}/%i.json --create-manifest"
    )
    for line in ("Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target"):
        assert line in staging.template.splitlines()


def test_staged_tree_marked_and_verified(staging: Staging) -> None:
    assert staging.marker["kind"] == "ct200-stage-marker", staging.marker
    assert staging.marker["source"] == "/tank/models/tb-tiny", staging.marker
    assert staging.marker["manifest_digest"] == staging.manifest["digest"]
    rc, out = staging.verify
    assert rc == 0, out
    # Byte for byte the source's files (the tree adds only its own .ct200- files).
    src = {
        p.removeprefix("/tank/models/tb-tiny"): e.get("sha256")
        for p, e in staging.sources_made.items()
        if p == "/tank/models/tb-tiny" or p.startswith("/tank/models/tb-tiny/")
    }
    dst = {
        p.removeprefix("/dev/shm/models/tb-tiny"): e.get("sha256")
        for p, e in staging.staged.items()
        if "/.ct200-" not in p
    }
    assert dst == src


def test_boot_restages_from_the_persistent_copy(staging: Staging) -> None:
    for name, state in staging.reboot.items():
        assert (state["ActiveState"], state["SubState"], state["Result"]) == (
            "active",
            "exited",
            "success",
        ), (name, state)
    assert staging.marker_after_reboot["staged_at"] != staging.marker["staged_at"]
    assert staging.marker_after_reboot["manifest_digest"] == staging.manifest["digest"]
    rc, out = staging.verify_after_reboot
    assert rc == 0, out
    # One at a time: the drafter's stage began after the first model's had ended.
    first, second = staging.reboot["tb-tiny"], staging.reboot["tb-tiny-draft"]
    assert int(second["ExecMainStartTimestampMonotonic"]) >= int(
        first["ExecMainExitTimestampMonotonic"]
    )


def test_sources_never_touched(staging: Staging) -> None:
    """Bytes, sizes, modes, owners, mtimes and ctimes of every file and directory of each
    persistent copy, after converge, re-runs, a restage, a failed run and retirement."""
    assert staging.sources_end == staging.sources_made


def test_missing_source_fails_before_any_change(staging: Staging) -> None:
    run = staging.missing
    assert run.rc != 0, run.describe()
    assert run.stats[CT]["failures"] == 1 and run.stats[CT]["changed"] == 0, run.describe()
    failed = run.results("failed")
    assert failed and "persistent copy is a directory" in failed[0], run.describe()
    assert "model tb-missing: its persistent copy /tank/models/tb-missing does not exist" in (
        " ".join(run.output.split())
    ), run.describe()
    changes = diff(staging.before_missing, staging.after_missing)
    assert not changes, "a failed preflight changed ct:\n" + "\n".join(changes)
    assert staging.units_after_missing == staging.reboot


def test_model_that_does_not_fit_fails_with_its_journal(staging: Staging) -> None:
    run = staging.huge
    assert run.rc != 0, run.describe()
    assert run.stats[CT]["rescued"] == 1, run.describe()
    output = " ".join(run.output.split())
    assert "model tb-huge does not fit" in output, run.describe()
    assert staging.huge_unit["ActiveState"] == "failed", staging.huge_unit
    # The timeout follows the size: 1 TiB at 1 GB/s is 1100 s, rounded up to whole minutes.
    assert staging.huge_unit["TimeoutStartUSec"] == "19min", staging.huge_unit


def test_models_removed_from_the_spec_are_retired(staging: Staging) -> None:
    run = staging.retire
    assert run.rc == 0, run.describe()
    for name, state in staging.retired.items():
        assert state["UnitFileState"] == "disabled", (name, state)
        assert state["ActiveState"] == "inactive", (name, state)
    # The role's drop-ins and their directories are gone (nothing else was in them).
    assert staging.retired_dropins.split() == [], staging.retired_dropins
    # Retiring a unit leaves its staged copy: only a reboot or a person frees that RAM.
    assert set(staging.staged_after_retire.split()) >= set(TREES)


def test_rendered_units_verify_clean(staging: Staging) -> None:
    """systemd-analyze verify, failing on any stderr, on every unit the converge added or
    changed: the template and each model's instance (with its drop-in)."""
    touched = [p for p in staging.converged if staging.converged[p] != staging.fresh.get(p)]
    rendered = [u for u in units.units_of(touched) if u.startswith(units.UNIT_DIRS)]
    expected = {TEMPLATE} | {f"/etc/systemd/system/{unit(n)}" for n in TREES}
    assert expected <= set(rendered), rendered

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        proc = staging.bed.ssh("ct", *argv)
        return proc.returncode, proc.stdout, proc.stderr

    problems = units.verify(rendered, run)
    assert not problems, "\n".join(map(str, problems))
