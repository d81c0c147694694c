"""site.yml records which inventory provisioned the machine (roles/ct200_tools,
tasks/spec.yml) and `ct200-serve chain` prints the whole recover.yml command from it
(issue 19: a printed `ansible-playbook playbooks/recover.yml` without -i failed when pasted).
Real ansible-playbook on localhost; the record is written to a temporary path."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ct200_tools import provisioned
from ct200_tools.cli import doctor as doctor_cli
from ct200_tools.cli import serve as serve_cli
from ct200_tools.provisioned import installed_spec_fix
from ct200_tools.serve import chain as ch

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")


def provision(checkout: Path, record: Path) -> str:
    """Run the role's task as site.yml does, from `checkout`/playbooks; the play's recap."""
    inventory = checkout / "inventory" / "my site" / "hosts.yml"
    inventory.parent.mkdir(parents=True, exist_ok=True)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"hosts": {"ct-7": host}}}))
    play = [
        {
            "hosts": "ct-7",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.import_role": {
                        "name": "ct200_tools",
                        "tasks_from": "spec.yml",
                    }
                }
            ],
        }
    ]
    (checkout / "playbooks").mkdir(exist_ok=True)
    (checkout / "playbooks" / "site.yml").write_text(json.dumps(play))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    # An extra-vars file given relative to the directory the user runs from (issue 33).
    (checkout.parent / "serving.yml").write_text("ct200_tools_test_marker: 1\n")
    proc = subprocess.run(
        [
            str(PLAYBOOK),
            "-i",
            str(inventory),
            str(checkout / "playbooks" / "site.yml"),
            "-e",
            "@serving.yml",
            "-e",
            json.dumps(
                {
                    "ct200_tools_provisioned_path": str(record),
                    "ct200_tools_spec_path": str(record.parent / "site.yml"),
                    "ct200_site": {"name": "my-site"},
                }
            ),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=checkout.parent,
        env={
            **env,
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_LIBRARY": str(REPO / "plugins/modules"),
            "ANSIBLE_MODULE_UTILS": str(REPO / "plugins/module_utils"),
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_site_records_the_inventory_and_chain_prints_the_whole_recover_command(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "ct200 tools"  # a space: the printed command must quote it
    checkout.mkdir()
    record = tmp_path / "provisioned.json"  # /etc/ct200 exists: spec.yml makes it first
    first = provision(checkout, record)
    assert re.search(r"ct-7\s+: ok=1\s+changed=1", first), first
    again = provision(checkout, record)
    assert re.search(r"ct-7\s+: ok=1\s+changed=0", again), again  # a second run changes nothing
    assert oct(record.stat().st_mode & 0o777) == "0o644"
    inventory = checkout / "inventory" / "my site" / "hosts.yml"
    assert json.loads(record.read_text()) == {
        "schema_version": 2,
        "checkout": str(checkout),
        "inventory": [str(inventory)],
        "extra_vars": [str(tmp_path / "serving.yml")],
        "inventory_dir": str(inventory.parent),
        "host": "ct-7",
    }
    fix = ch.recover_command(str(record))
    command = fix.split("`")[1]
    assert command == (
        f"cd '{checkout}' && ansible-playbook -i '{inventory}' -e @{tmp_path}/serving.yml"
        " playbooks/recover.yml --limit ct-7,localhost"
    )
    bash = shutil.which("bash")
    assert bash is not None
    assert subprocess.run([bash, "-n", "-c", command], timeout=10, check=False).returncode == 0
    # Pasted in the checkout's shell it reaches the inventory and the playbook directory.
    probe = (
        command.replace("ansible-playbook -i", "test -f")
        .replace(" -e @", " && test -f ")
        .replace(" playbooks/recover.yml --limit ct-7,localhost", " && test -d playbooks")
    )
    assert subprocess.run([bash, "-c", probe], timeout=10, check=False).returncode == 0


def test_a_record_without_extra_vars_says_so(tmp_path: Path) -> None:
    """A record written before the extra-vars files were recorded: the command, and a note that
    it may lack the -e @FILE the machine was provisioned with (never a silent other spec)."""
    fix = ch.recover_command(str(record_of(tmp_path)))
    assert "predates recording them" in fix, fix
    record = tmp_path / "provisioned.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "extra_vars": ["/srv/inv/serving.yml"]}))
    fix = ch.recover_command(str(record))
    assert "-e @/srv/inv/serving.yml playbooks/recover.yml" in fix and "predates" not in fix
    record.write_text(json.dumps({**data, "extra_vars": [7]}))
    assert "does not know them" in ch.recover_command(str(record))


def test_without_a_record_the_fix_says_plainly_what_to_fill_in(tmp_path: Path) -> None:
    fix = ch.recover_command(str(tmp_path / "none.json"))
    assert "does not know them" in fix and "INVENTORY" in fix
    command = fix.split("`")[1]
    bash = shutil.which("bash")
    assert bash is not None
    assert subprocess.run([bash, "-n", "-c", command], timeout=10, check=False).returncode == 0


def record_of(tmp_path: Path) -> Path:
    record = tmp_path / "provisioned.json"
    record.write_text(
        json.dumps(
            {"checkout": "/srv/ct200-tools", "inventory": ["/srv/inv/hosts.yml"], "host": "ct-7"}
        )
    )
    return record


def test_an_unusable_installed_spec_names_the_playbook_that_writes_it(tmp_path: Path) -> None:
    """The machine's copy of the spec is the playbooks' (written from the inventory): the fix
    for an unparsable one is the recover.yml command that writes it again, not `ct200-serve
    chain` again (issue 19). Any other spec file: its own issues say what to edit."""
    installed = tmp_path / "etc" / "site.yml"
    fix = installed_spec_fix(str(installed), str(installed), str(record_of(tmp_path)))
    assert fix is not None
    command = fix.split("`")[1]
    assert command == (
        "cd /srv/ct200-tools && ansible-playbook -i /srv/inv/hosts.yml playbooks/recover.yml"
        " --limit ct-7,localhost"
    )
    assert installed_spec_fix(str(tmp_path / "mine.yml"), str(installed)) is None
    assert installed_spec_fix("", str(installed)) is None


@pytest.mark.parametrize("program", ["serve", "doctor"])
def test_the_clis_print_it_for_an_unparsable_installed_spec(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    program: str,
) -> None:
    installed = tmp_path / "site.yml"
    installed.write_text("ct200_site:\n  servers: [\n")
    record = record_of(tmp_path)
    real = provisioned.installed_spec_fix
    monkeypatch.setattr(
        (serve_cli if program == "serve" else doctor_cli),
        "installed_spec_fix",
        lambda source: real(source, str(installed), str(record)),
    )
    args = (
        ["chain", "--spec", str(installed)]
        if program == "serve"
        else ["check", "--spec", str(installed)]
    )
    main = serve_cli.main if program == "serve" else doctor_cli.main
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "fix: " in err and "playbooks/recover.yml --limit ct-7,localhost" in err, err
