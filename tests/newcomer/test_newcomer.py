"""What the README promises a new user, checked against the checkout: the layout it shows, the
commands it runs in a new shell, and a site of one's own that cannot reach the testbed."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
VENV_BIN = Path(sys.executable).parent
ENTRY = re.compile(r"^(\S+/)\s")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def layout() -> dict[str, str]:
    """The README's layout block: top-level entry -> the text of its lines."""
    block = section("Layout").split("```")[1]
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        match = ENTRY.match(line + " ")
        if match:
            current = match.group(1)
            entries[current] = line[len(current) :]
        elif current and line.strip():
            entries[current] += "\n" + line
    return entries


def tracked() -> list[str]:
    """The checkout's files, as a fresh clone has them (plus new files not yet committed)."""
    proc = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in proc.stdout.splitlines() if (REPO / f).exists()]


def subdirs(top: str) -> set[str]:
    return {f.split("/")[1] + "/" for f in tracked() if f.startswith(top) and f.count("/") >= 2}


def test_layout_names_every_top_level_directory() -> None:
    top = {f.split("/")[0] + "/" for f in tracked() if "/" in f and not f.startswith(".")}
    assert set(layout()) == top


def test_layout_of_the_package_is_the_package() -> None:
    """Every module and subpackage of ct200_tools is named (globs allowed), and every name in
    the block matches one. Its entries are the lines indented by two; deeper lines continue an
    entry's description or name what is inside a subpackage."""
    text = layout()["ct200_tools/"].split("\n", 1)[1]
    names = [
        token
        for line in text.splitlines()
        if len(line) - len(line.lstrip()) == 2
        for token in re.split(r",\s*", line.strip().split("  ")[0])
        if token
    ]
    package = REPO / "ct200_tools"
    real = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    real |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    unnamed = {r for r in real if not any(fnmatch.fnmatch(r, n) for n in names)}
    assert unnamed == set(), f"README's layout does not name {sorted(unnamed)}"
    stale = [n for n in names if not any(fnmatch.fnmatch(r, n) for r in real)]
    assert stale == [], f"README's layout names what ct200_tools lacks: {stale}"


@pytest.mark.parametrize("top", ["tests/", "benchmarks/"])
def test_layout_of_tests_and_benchmarks(top: str) -> None:
    named = set(re.findall(r"(\w+/)", layout()[top]))
    assert named == subdirs(top)


def test_layout_of_scripts() -> None:
    named = set(re.findall(r"[\w-]+\.(?:sh|py)", layout()["scripts/"]))
    assert named == {f.split("/")[1] for f in tracked() if f.startswith("scripts/")}


def test_commands_on_path_in_a_new_shell() -> None:
    """The README's `. .venv/bin/activate` puts every command it uses on a bare PATH."""
    assert ". .venv/bin/activate" in section("Quick start")
    if VENV_BIN != REPO / ".venv" / "bin":
        pytest.skip(f"the tests run from {VENV_BIN}, not this checkout's .venv")
    commands = ["ct200-doctor", "ct200-stage", "ansible-playbook", "ansible-lint"]
    script = (
        f". .venv/bin/activate && command -v {' '.join(commands)} && ct200-doctor --help >/dev/null"
    )
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(VENV_BIN / c) for c in commands]


def ansible_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}


def test_site_without_inventory_stops_before_connecting() -> None:
    """No default inventory: a run without -i cannot reach any machine (the testbed's included)
    and says what to do."""
    dump = subprocess.run(
        [str(VENV_BIN / "ansible-config"), "dump", "--only-changed"],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "DEFAULT_HOST_LIST" not in dump.stdout
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "playbooks/site.yml"],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out
    assert "pass your site's inventory with -i inventory/<site>" in out
    recap = out[out.index("PLAY RECAP") :]
    assert re.findall(r"(\S+) : ok=", recap) == ["localhost"]


def test_own_site_from_the_example(tmp_path: Path) -> None:
    """`cp -r inventory/ct200 inventory/mysite`: the copy validates, and -i targets its hosts."""
    site = tmp_path / "mysite"
    shutil.copytree(REPO / "inventory" / "ct200", site)
    hosts = site / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("192.0.2.", "198.51.100."))
    validate = subprocess.run(
        [str(VENV_BIN / "ct200-doctor"), "validate", str(site)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert validate.returncode == 0, validate.stdout + validate.stderr
    listed = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(site), "playbooks/site.yml", "--list-hosts"],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    hosts_listed = re.findall(r"^\s+(\S+)$", listed.stdout, re.MULTILINE)
    assert sorted(set(hosts_listed)) == ["ct200-ct", "ct200-pve", "localhost"], listed.stdout
    # The container play installs from what `make wheelhouse` writes.
    wheelhouse = subprocess.run(
        [
            str(VENV_BIN / "ansible"),
            *("-i", str(site), "ct200-ct", "-c", "local", "--playbook-dir", "playbooks"),
            *("-m", "ansible.builtin.debug", "-a", "var=ct200_tools_wheelhouse"),
        ],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert wheelhouse.returncode == 0, wheelhouse.stdout + wheelhouse.stderr
    path = re.search(r"ct200_tools_wheelhouse: (\S+)", wheelhouse.stdout)
    assert path, wheelhouse.stdout
    assert Path(path.group(1)).resolve() == REPO / "dist" / "ct200-tools-wheelhouse.tar"
