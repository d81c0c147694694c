"""The ct200_files module through real ansible-playbook runs on this machine (connection local, in
a temporary directory): what it writes, what a re-run changes (nothing), check mode (nothing
written), --diff, and the refusals that change nothing. The roles that use it are tested on the
testbed (tests/testbed)."""

from __future__ import annotations

import grp
import importlib.util
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ct200_tools import fsutil

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
MODULE = ROOT / "plugins/modules/ct200_files.py"


def run(tmp: Path, args: dict[str, Any], *flags: str) -> tuple[int, dict[str, Any], str]:
    """One play of one ct200_files task; its registered result (the module's own) and output."""
    if not (VENV_BIN / "ansible-playbook").exists():
        pytest.skip(f"ansible-playbook is not installed in {VENV_BIN}: run `bash scripts/setup.sh`")
    out = tmp / "result.json"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {"name": "Files.", "ct200_files": args, "register": "r", "ignore_errors": True},
                {
                    "name": "Keep the result.",
                    "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(out)},
                    "check_mode": False,
                    "diff": False,
                },
            ],
        }
    ]
    playbook = tmp / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(ROOT / "plugins/modules"),
    }
    inventory = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    (tmp / "hosts").write_text(inventory + "\n")
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(tmp / "hosts"), str(playbook), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def mine(extra: dict[str, Any]) -> dict[str, Any]:
    return {"owner": USER, "group": GROUP, **extra}


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under root: its content (or 'dir') and mode."""
    got = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        what = "dir" if path.is_dir() else path.read_text() if path.is_file() else "other"
        got[str(path.relative_to(root))] = (what, stat.S_IMODE(st.st_mode))
    return got


@pytest.fixture
def box(tmp_path: Path) -> Path:
    (tmp_path / "box").mkdir()
    return tmp_path / "box"


def test_writes_then_a_rerun_changes_nothing(tmp_path: Path, box: Path) -> None:
    args = mine(
        {
            "directories": [{"path": str(box / "lib/sub")}],
            "files": [
                {"dest": str(box / "lib/sub/a.py"), "content": "print('a')\n"},
                {"dest": str(box / "run"), "content": "#!/bin/sh\nexit 0\n", "mode": "0755"},
                {"dest": str(box / "empty"), "content": ""},
            ],
        }
    )
    rc, r, _ = run(tmp_path, args)
    assert rc == 0 and r["changed"] and not r.get("failed"), r
    assert tree(box) == {
        "empty": ("", 0o644),
        "lib": ("dir", 0o755),
        "lib/sub": ("dir", 0o755),
        "lib/sub/a.py": ("print('a')\n", 0o644),
        "run": ("#!/bin/sh\nexit 0\n", 0o755),
    }
    assert r["content_changed"] == [str(box / "lib/sub/a.py"), str(box / "run"), str(box / "empty")]
    rc, again, _ = run(tmp_path, args)
    assert rc == 0 and not again["changed"], again
    assert again["changed_paths"] == [] and again["content_changed"] == []


def test_a_changed_content_or_mode_is_rewritten_and_named(tmp_path: Path, box: Path) -> None:
    (box / "a").write_text("old\n")
    (box / "b").write_text("same\n")
    os.chmod(box / "a", 0o644)
    os.chmod(box / "b", 0o600)
    args = mine(
        {
            "files": [
                {"dest": str(box / "a"), "content": "new\n"},
                {"dest": str(box / "b"), "content": "same\n"},
            ]
        }
    )
    rc, r, out = run(tmp_path, args, "--diff")
    assert rc == 0, out
    assert r["content_changed"] == [str(box / "a")]
    assert r["changed_paths"] == [str(box / "a"), str(box / "b")]
    assert tree(box) == {"a": ("new\n", 0o644), "b": ("same\n", 0o644)}
    assert "-old" in out and "+new" in out
    assert not list(box.glob(".*")), "a temporary file was left behind"


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path: Path, box: Path) -> None:
    (box / "a").write_text("old\n")
    before = tree(box)
    args = mine(
        {
            "directories": [{"path": str(box / "d")}],
            "files": [
                {"dest": str(box / "a"), "content": "new\n"},
                {"dest": str(box / "d/new"), "content": "x\n"},
            ],
        }
    )
    rc, r, out = run(tmp_path, args, "--check", "--diff")
    assert rc == 0, out
    assert r["changed"] and r["content_changed"] == [str(box / "a"), str(box / "d/new")]
    assert tree(box) == before


def test_absent_removes_a_file_and_only_a_file(tmp_path: Path, box: Path) -> None:
    (box / "gone").write_text("x\n")
    args = mine({"files": [{"dest": str(box / "gone"), "state": "absent"}]})
    rc, r, _ = run(tmp_path, args)
    assert rc == 0 and r["content_changed"] == [str(box / "gone")]
    assert tree(box) == {}
    rc, r, _ = run(tmp_path, args)
    assert rc == 0 and not r["changed"]


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_destination_it_did_not_make_is_refused_before_any_change(
    tmp_path: Path, box: Path, kind: str
) -> None:
    (box / "target").write_text("someone's\n")
    if kind == "symlink":
        (box / "b").symlink_to(box / "target")
    else:
        (box / "b").mkdir()
    before = tree(box)
    args = mine(
        {
            "files": [
                {"dest": str(box / "a"), "content": "first\n"},
                {"dest": str(box / "b"), "content": "second\n"},
            ]
        }
    )
    _, r, _ = run(tmp_path, args)
    assert r["failed"] and not r["changed"], r
    assert f"{box / 'b'} exists and is not a regular file" in r["msg"]
    assert "nothing was changed" in r["msg"]
    assert tree(box) == before


def test_a_mode_that_is_no_octal_is_refused_by_name(tmp_path: Path, box: Path) -> None:
    args = mine({"files": [{"dest": str(box / "a"), "content": "x\n", "mode": "rw-r--r--"}]})
    _, r, _ = run(tmp_path, args)
    assert r["failed"] and "mode 'rw-r--r--'" in r["msg"] and "0644" in r["msg"]
    assert tree(box) == {}


def test_content_is_required_for_a_file(tmp_path: Path, box: Path) -> None:
    _, r, _ = run(tmp_path, mine({"files": [{"dest": str(box / "a")}]}))
    assert r["failed"] and "content" in r["msg"]
    assert tree(box) == {}


def test_the_documentation_is_the_argument_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-doc finds the module by its short name, and its options are the ones it takes."""
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-t", "module", "--json", "ct200_files"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["ct200_files"]["doc"]["options"]
    # What Ansible ships as module_utils/ct200_fsutil.py (a link to it), for the import here.
    monkeypatch.setitem(sys.modules, "ansible.module_utils.ct200_fsutil", fsutil)
    loader = importlib.util.spec_from_file_location("ct200_files", MODULE)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    spec = module.ARGUMENT_SPEC
    assert set(doc) == set(spec)
    for key in ("files", "directories"):
        assert set(doc[key]["suboptions"]) == set(spec[key]["options"])
    for key, option in spec.items():
        assert doc[key].get("default") == option.get("default"), key


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another group needs root")
def test_a_new_file_and_directory_get_their_owner_and_group(tmp_path: Path, box: Path) -> None:
    """As the inference_servers' config files: root-owned, the service group's to read."""
    args = {
        "group": "daemon",
        "directories": [{"path": str(box / "d"), "mode": "0750"}],
        "files": [{"dest": str(box / "d/f"), "content": "x\n", "mode": "0640"}],
    }
    rc, _, out = run(tmp_path, args)
    assert rc == 0, out
    daemon = grp.getgrnam("daemon").gr_gid
    for path, mode in ((box / "d", 0o750), (box / "d/f", 0o640)):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, daemon, mode), path
    assert not run(tmp_path, args)[1]["changed"]


def test_the_shipped_write_is_the_projects_own() -> None:
    """module_utils/ct200_fsutil.py is ct200_tools/fsutil.py (a link), shipped with the module."""
    shipped = ROOT / "plugins/module_utils/ct200_fsutil.py"
    assert shipped.is_symlink()
    assert shipped.resolve() == (ROOT / "ct200_tools/fsutil.py").resolve()


def test_backup_keeps_the_previous_content_of_each_replaced_file(tmp_path: Path) -> None:
    """What the inference_servers role rolls a server back with (issue 33): a replaced file's
    previous content beside it, a new file mapped to null, an unchanged one not listed."""
    old, new, same = tmp_path / "old.service", tmp_path / "new.env", tmp_path / "same.yaml"
    old.write_text("before\n")
    same.write_text("same\n")
    files = [
        {"dest": str(old), "content": "after\n"},
        {"dest": str(new), "content": "made\n"},
        {"dest": str(same), "content": "same\n"},
    ]
    rc, r, out = run(tmp_path, mine({"files": files, "backup": True}))
    assert rc == 0, out
    backups = r["backups"]
    assert set(backups) == {str(old), str(new)} and backups[str(new)] is None
    assert Path(backups[str(old)]).read_text() == "before\n"
    assert old.read_text() == "after\n"
    # Without backup (the default) nothing is kept.
    rc, r, out = run(tmp_path, mine({"files": [{"dest": str(old), "content": "again\n"}]}))
    assert rc == 0 and r["backups"] == {}, out
