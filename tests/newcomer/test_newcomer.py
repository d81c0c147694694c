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
import yaml

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


# -- the quickstart: what it runs, what README says it runs, and the spec it serves -----------

QUICKSTART = (REPO / "scripts" / "quickstart.sh").read_text()
SERVING = REPO / "inventory" / "testbed" / "serving.yml"
#: `python -m testbed ...` / `$PY -m testbed ...` commands in a text, as `ARGS`.
TESTBED_CMD = re.compile(r'(?:python|"\$PY") -m testbed ([a-z][\w-]*(?: [^\n#`<]*)?)')


def bed_commands(text: str) -> list[str]:
    return [" ".join(m.group(1).split()) for m in TESTBED_CMD.finditer(text)]


def script_runs() -> str:
    """The quickstart's own steps: its lines, less comments and the text it prints or pipes."""
    kept, inside = [], ""
    for line in QUICKSTART.splitlines():
        if inside:
            inside = "" if line == inside else inside
            continue
        if line.lstrip().startswith("#"):
            continue
        heredoc = re.search(r"<<'?(\w+)'?", line)
        inside = heredoc.group(1) if heredoc else ""
        kept.append(line)
    return "\n".join(kept)


def test_readme_names_every_step_the_quickstart_takes() -> None:
    """Each `python -m testbed` step of the script is in the Quick start, and so is each ct200
    tool it runs on the machine: the README cannot describe a run the script does not make."""
    readme = " ".join(section("Quick start").split())
    runs = bed_commands(script_runs())
    assert [c.split()[0] for c in runs][:3] == ["up", "llama", "ssh"], runs
    missing = [c for c in runs if f"python -m testbed {c.split()[0]}" not in readme]
    tools = {t for c in runs for t in re.findall(r"(ct200-[a-z]+ [a-z][\w-]*)", c)}
    missing += [t for t in sorted(tools) if t not in readme]
    assert missing == [], f"README's Quick start lacks: {missing}"


def test_readme_shows_the_recovery_the_quickstart_prints() -> None:
    """The reboot and what to run after it, as the script's last words print them, are the
    README's block word for word."""
    printed = QUICKSTART[QUICKSTART.index("Zero-touch recovery") :].split("\n\n")[0]
    lines = [ln.split("#")[0].strip() for ln in printed.splitlines()[2:]]
    assert lines[0] == "python -m testbed reboot", lines
    block = section("Quick start")
    assert all(ln and ln in block for ln in lines), lines


def test_the_quickstart_converges_the_serving_spec_and_needs_a_clean_doctor() -> None:
    assert "SPEC=inventory/testbed/serving.yml" in QUICKSTART
    assert 'ansible-playbook -i "$INVENTORY" -e "@$SPEC" playbooks/site.yml' in QUICKSTART
    assert "-e @inventory/testbed/serving.yml" in " ".join(section("Quick start").split())
    # Only a clean doctor goes on: every other exit stops the script.
    case = QUICKSTART[QUICKSTART.index("case $rc in") : QUICKSTART.index("esac")]
    assert re.findall(r"^\s+(\S+)\)", case, re.MULTILINE) == ["0", "255", "*"]
    assert "fail " in case.split("*)")[1]
    proc = subprocess.run(["bash", "-n", "scripts/quickstart.sh"], cwd=REPO, check=False)
    assert proc.returncode == 0


def test_the_testbed_commands_the_quickstart_names_exist() -> None:
    from testbed import cli  # noqa: PLC0415

    named = {c.split()[0] for c in bed_commands(QUICKSTART + section("Quick start"))}
    assert named <= set(cli.main.commands), named - set(cli.main.commands)
    serve = set(re.findall(r"ct200-serve (\w[\w-]*)", QUICKSTART + section("Quick start")))
    from ct200_tools.cli.serve import cli as serve_cli  # noqa: PLC0415

    assert serve <= set(serve_cli.commands), serve - set(serve_cli.commands)


def test_the_serving_spec_says_what_the_testbed_has() -> None:
    """No GPU, the model `python -m testbed llama` writes, the program it puts there, and the
    rest of the testbed's site as group_vars/all.yml has it (written once there)."""
    from ct200_tools.serve import engines  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415
    from testbed import cli, llama_server  # noqa: PLC0415

    data = yaml.safe_load(SERVING.read_text())["ct200_site"]
    base = yaml.safe_load((REPO / "inventory/testbed/group_vars/all.yml").read_text())
    assert {k: v for k, v in data.items() if k not in ("gpus", "models", "servers")} == {
        k: v for k, v in base["ct200_site"].items() if k not in ("gpus", "models", "servers")
    }
    spec = load_spec(SERVING)
    assert spec.gpus.count == 0
    (server,) = [s for s in spec.servers if s.enabled]
    assert server.gpus == () and server.command[0] == llama_server.PROGRAM
    (model,) = spec.needed_models([server])
    assert model.source == f"{llama_server.MODELS_ROOT}/{model.name}"
    argv = engines.argv(spec, server)  # engine: llamacpp renders -m from the staged copy
    assert argv[argv.index("-m") + 1] == f"{model.staged}/{llama_server.MODEL_FILE}"
    written = next(p for p in cli.llama.params if p.name == "models").default
    assert tuple(written) == (model.name,)  # type: ignore[arg-type]
    assert f"PORT={server.port}\n" in QUICKSTART
    assert f"ct200-server-{server.name}.service" in QUICKSTART
