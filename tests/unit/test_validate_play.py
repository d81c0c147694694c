"""playbooks/validate.yml with real ansible-playbook on the controller (localhost only): it refuses
a bad spec with every path, exports the validated spec and SiteSpec.needed_models(), and the
model_staging role's defaults read them (every model, and the needed ones to stage), also under
--check --tags staging.
No testbed: the plays here run on localhost alone (the role itself runs in tests/testbed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.spec import SPEC_KEY, load_spec, model_to_dict
from tests.unit.spec_helpers import EXAMPLE_DIR, REPO, changed

PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
INVENTORY = EXAMPLE_DIR / "hosts.yml"

pytestmark = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")


def playbook(tmp_path: Path, *, validate: int = 1) -> tuple[Path, Path]:
    """Validation (imported `validate` times), then a play that writes what the role would
    stage to out.json."""
    out = tmp_path / "out.json"
    plays = [
        {
            "name": "Validate",
            "ansible.builtin.import_playbook": str(REPO / "playbooks" / "validate.yml"),
        }
    ] * validate + [
        {
            "name": "Read what model_staging would stage",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(REPO / "roles" / "model_staging" / "defaults" / "main.yml")],
            "tasks": [
                {
                    "name": "Write model_staging_models and the exported spec",
                    "ansible.builtin.copy": {
                        "content": "{{ {'models': model_staging_models, "
                        "'serving': model_staging_serving, "
                        "'validated': hostvars['localhost'].ct200_validated} | to_json }}",
                        "dest": str(out),
                        "mode": "0644",
                    },
                    "check_mode": False,
                    "tags": ["always"],
                }
            ],
        }
    ]
    path = tmp_path / "play.yml"
    path.write_text(json.dumps(plays))  # JSON is YAML
    return path, out


def ansible(
    play: Path, *args: str, inventory: Path = INVENTORY
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    return subprocess.run(
        [str(PLAYBOOK), "-i", str(inventory), str(play), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def extra_vars(tmp_path: Path, site: dict[str, Any]) -> str:
    path = tmp_path / "site.json"
    path.write_text(json.dumps({SPEC_KEY: site}))
    return f"@{path}"


@pytest.mark.parametrize("args", [(), ("--check", "--tags", "staging")], ids=["run", "check-tag"])
def test_role_defaults_are_every_model_and_the_needed_ones(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Units for every model (a switch may stage any); enabled and staged: the needed ones."""
    play, out = playbook(tmp_path)
    r = ansible(play, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    spec = load_spec(EXAMPLE_DIR)
    assert got["models"] == [model_to_dict(m) for m in spec.models]
    assert got["serving"] == [m.name for m in spec.needed_models()]
    assert got["serving"] == ["qwen3.6-27b", "qwen3.6-27b-dflash"]
    assert got["validated"]["needed_models"] == [model_to_dict(m) for m in spec.needed_models()]
    assert got["validated"]["site"]["shm"] == {"size": "1200G", "reserve_ram": "64G"}
    assert got["validated"]["warnings"] == []


def test_the_switch_to_kimi_stages_kimi_and_its_drafter(tmp_path: Path) -> None:
    site = changed(
        {"servers[0].enabled": False, "servers[1].enabled": False, "servers[3].enabled": True}
    )
    play, out = playbook(tmp_path)
    r = ansible(play, "-e", extra_vars(tmp_path, site))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text())["serving"] == ["kimi-k2.6", "kimi-k2.6-eagle3"]


def test_warnings_are_shown(tmp_path: Path) -> None:
    site = changed({"servers[0].gpus": [2, 3, 4, 5], "servers[1].gpus": [6, 7]})
    play, out = playbook(tmp_path)
    r = ansible(play, "-e", extra_vars(tmp_path, site))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "servers[0].gpus: the TP group spans NUMA nodes 0, 1" in r.stdout
    assert json.loads(out.read_text())["validated"]["warnings"]


def test_bad_spec_stops_the_run_with_every_path(tmp_path: Path) -> None:
    site = changed(
        {
            "shm.size": 1200,
            "models[0].source": "/dev/shm/persistent",
            "servers[0].host": "0.0.0.0:30001",
            "servers[1].speculative.draft_model": "/dev/shm/models/qwen3.6-27b",
            "servers[0].env.NCCL_PROTO": "LL\nX=1",
        }
    )
    play, out = playbook(tmp_path)
    r = ansible(play, "--check", "--tags", "staging", "-e", extra_vars(tmp_path, site))
    assert r.returncode != 0
    for path in (
        "shm.size: 1200 has no unit",
        "models[0].source: /dev/shm/persistent is under /dev/shm",
        "servers[0].host: '0.0.0.0:30001' has a port",
        "servers[1].speculative.draft_model:",
        "servers[0].env.NCCL_PROTO: contains the control character",
    ):
        assert path in r.stdout, r.stdout
    assert not out.exists()


def test_role_default_without_the_validate_play_says_what_to_do(tmp_path: Path) -> None:
    play, out = playbook(tmp_path, validate=0)
    r = ansible(play)
    assert r.returncode != 0
    assert "no validated site spec on localhost" in r.stdout, r.stdout
    assert "keep localhost in --limit" in r.stdout
    assert not out.exists()


def test_validate_imported_twice_validates_once(tmp_path: Path) -> None:
    # site.yml imports validate.yml, then container.yml imports it again.
    play, out = playbook(tmp_path, validate=2)
    r = ansible(play)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = r.stdout.split("TASK [Validate ct200_site with ct200_tools.spec.]")[1:]
    assert [run.split("\n\n")[0].split()[-2:] for run in runs] == [
        ["ok:", "[localhost]"],
        ["skipping:", "[localhost]"],
    ], r.stdout
    assert json.loads(out.read_text())["models"]


def test_an_inventory_without_a_spec_says_where_to_put_it(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    localhost:\n")
    play, out = playbook(tmp_path)
    r = ansible(play, inventory=inventory)
    assert r.returncode != 0
    assert "ct200_site is not defined for localhost." in r.stdout, r.stdout
    assert "fix: pass your site's inventory with -i inventory/<site>" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert not out.exists()
