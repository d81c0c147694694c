"""ct200_tools/host/chain.py: the PVE host's boot units read back from `systemctl show`, where
they stopped, and their textfile (bootsteps.py's rendering, kind="host"). The systemctl output has
the shape systemd 252 (bookworm) prints; tests/testbed/test_host_chain.py reads the real thing
after real reboots of the testbed's pve machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from ct200_tools.host import chain as hc
from ct200_tools.serve.bootsteps import Chain

REPO = Path(__file__).resolve().parents[2]
ZERO = 50_000_000
MANAGER = f"UserspaceTimestampMonotonic={ZERO}\nFinishTimestampMonotonic={ZERO + 7_000_000}\n"
ORDER = [
    ("host", "host-devices", "ct200-host-devices.service"),
    ("host", "pcie-tune", "ct200-pcie-tune.service"),
]
SAMPLE = re.compile(r'^[a-z_][a-z0-9_]*(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.]+$')


def block(unit: str, active: str, sub: str, start: float, up: float, **extra: str) -> str:
    props = {
        "Id": unit,
        "LoadState": "loaded",
        "ActiveState": active,
        "SubState": sub,
        "Result": "success" if active != "failed" else "exit-code",
        "UnitFileState": "enabled",
        "InactiveExitTimestampMonotonic": str(ZERO + int(start * 1e6)) if start else "0",
        "ActiveEnterTimestampMonotonic": str(ZERO + int(up * 1e6)) if up else "0",
        **extra,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items()) + "\n"


GOOD = (
    block("ct200-host-devices.service", "active", "exited", 1.5, 2.0),
    block("ct200-pcie-tune.service", "active", "exited", 2.0, 2.25),
)
DISABLED = block("ct200-host-devices.service", "inactive", "dead", 0, 0, UnitFileState="disabled")
FAILED = block("ct200-host-devices.service", "failed", "failed", 1.5, 0)


def fake(*blocks: str, journal: str = "") -> tuple[hc.Run, list[list[str]]]:
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        calls.append(list(argv))
        if argv[0] == "journalctl":
            return 0, journal, ""
        return 0, (MANAGER if argv[-1].startswith("--property=") else "".join(blocks)), ""

    return run, calls


def test_a_good_host_chain_times_each_unit_from_the_hosts_start() -> None:
    run, calls = fake(*GOOD)
    got = hc.read(ORDER, run)
    assert got.ok and got.machine == "host" and got.boot_s == 7.0
    assert [(s.kind, s.name, s.state, s.seconds) for s in got.steps] == [
        ("host", "host-devices", "ok", 0.5),
        ("host", "pcie-tune", "ok", 0.25),
    ]
    # argv lists, one call for the units and one for the manager; no journal when all is good.
    assert calls[0][:3] == ["systemctl", "show", "--no-pager"]
    assert calls[0][-2:] == ["ct200-host-devices.service", "ct200-pcie-tune.service"]
    assert len(calls) == 2


def test_the_host_textfile_is_the_containers_families_with_kind_host() -> None:
    text = hc.textfile(hc.read(ORDER, fake(*GOOD)[0]), 1_700_000_000.0)
    for line in text.splitlines():
        assert line.startswith("# ") or SAMPLE.match(line), line
    assert "ct200_boot_chain_ok 1" in text
    assert (
        'ct200_boot_step_state{kind="host",name="host-devices",'
        'unit="ct200-host-devices.service",state="ok"} 1'
    ) in text
    assert 'ct200_boot_step_active_seconds{kind="host",name="pcie-tune"} 2.250' in text
    assert 'ct200_boot_step_seconds{kind="host",name="host-devices"} 0.500' in text
    assert "ct200_boot_chain_stopped{" not in text
    # Nothing of the container's serving set on the host.
    assert "ct200_boot_serving" not in text
    assert "ct200_boot_report_timestamp_seconds 1700000000" in text


def test_a_disabled_unit_did_not_run_and_stops_the_chain_there() -> None:
    run, calls = fake(DISABLED, GOOD[1])
    got = hc.read(ORDER, run)
    stopped = got.stopped
    assert stopped is not None and (stopped.name, stopped.state) == ("host-devices", "off")
    assert stopped.detail == "inactive (dead), disabled"
    assert len(calls) == 2  # nothing of it in this boot's journal
    text = hc.textfile(got, 0)
    assert "ct200_boot_chain_ok 0" in text
    assert (
        'ct200_boot_chain_stopped{kind="host",name="host-devices",'
        'unit="ct200-host-devices.service",state="off",failed_at=""} 1'
    ) in text
    out = "\n".join(hc.lines(got))
    assert out.startswith("host boot chain: STOPPED")
    assert "stopped at: host host-devices (ct200-host-devices.service): off" in out
    assert (
        "fix: disabled, it did not run at this boot: "
        "`systemctl enable --now ct200-host-devices.service`"
    ) in out
    assert "playbooks/recover.yml --limit HOST,localhost --tags recover_host" in out


def test_a_failed_unit_brings_this_boots_journal_and_its_fix() -> None:
    journal = "ct200-host-devices: cannot load nvidia: is the NVIDIA driver installed?\n"
    run, calls = fake(FAILED, GOOD[1], journal=journal)
    got = hc.read(ORDER, run)
    assert got.stopped is not None and got.stopped.state == "failed"
    assert calls[-1][0] == "journalctl"
    assert "--boot" in calls[-1] and "--unit=ct200-host-devices.service" in calls[-1]
    out = "\n".join(hc.lines(got))
    assert "    ct200-host-devices: cannot load nvidia" in out
    assert "fix: `journalctl -b -u ct200-host-devices.service` says why" in out


@pytest.mark.parametrize(
    ("props", "fix"),
    [
        ("LoadState=masked\n", "systemctl unmask ct200-host-devices.service &&"),
        ("LoadState=not-found\n", "playbooks/host.yml"),
    ],
)
def test_masked_and_missing_units_have_their_own_fix(props: str, fix: str) -> None:
    unit = "Id=ct200-host-devices.service\nActiveState=inactive\nSubState=dead\n" + props + "\n"
    got = hc.read(ORDER[:1], fake(unit)[0])
    assert got.stopped is not None
    assert hc.fix_of(got.stopped).startswith(fix) or fix in hc.fix_of(got.stopped)


def test_systemctl_that_cannot_be_asked_is_an_error_not_a_chain() -> None:
    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        return 1, "", "Failed to connect to bus: Host is down"

    with pytest.raises(hc.SystemdError, match="Host is down"):
        hc.read(ORDER, run)


@pytest.mark.parametrize("step", ["host devices=x.service", "a=b", "=x.service", "A=x.service"])
def test_a_bad_step_is_refused_naming_it(step: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert hc.main(["--step", step]) == hc.Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert f"--step {step!r}" in err and "NAME=UNIT" in err and "Traceback" not in err


def test_no_step_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert hc.main([]) == hc.Exit.BAD_INPUT
    assert "no --step given" in capsys.readouterr().err


def test_the_textfile_is_written_whole_0644_and_exit_says_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped = hc.read(ORDER, fake(DISABLED, GOOD[1])[0])

    def read(order: Sequence[tuple[str, str, str]]) -> Chain:
        assert list(order) == ORDER
        return stopped

    monkeypatch.setattr(hc, "read", read)
    out = tmp_path / "prom" / "ct200_host_boot.prom"
    steps = [f"--step={n}={u}" for _, n, u in ORDER]
    assert hc.main([*steps, "--textfile", str(out)]) == hc.Exit.STOPPED
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert out.read_text().startswith("# HELP ct200_boot_chain_ok")
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temp file left
    assert f"report: {out}" in capsys.readouterr().out


def test_the_modules_the_role_ships_run_with_the_standard_library_alone(tmp_path: Path) -> None:
    """What roles/host_boot_report copies to the host is all ct200-host-chain needs: a host
    without ct200-tools and its dependencies (an isolated interpreter, only these files)."""
    names = yaml.safe_load((REPO / "roles/host_boot_report/vars/main.yml").read_text())[
        "host_boot_report_modules"
    ]
    pkg = tmp_path / "ct200_tools"
    pkg.mkdir()
    for name in names:
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "ct200_tools" / name, pkg / name)
    # -I -S: no environment, no site-packages (ct200-tools and its dependencies are there).
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import ct200_tools.host.chain as h; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ct200_tools')))); "
        "sys.exit(h.main(['--step', 'bad']))"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == hc.Exit.BAD_INPUT, proc.stderr
    assert "NAME=UNIT" in proc.stderr and "Traceback" not in proc.stderr
    loaded = json.loads(proc.stdout)
    assert "ct200_tools.host.chain" in loaded
    for m in loaded:
        path = "/".join(m.split(".")[1:])
        assert m == "ct200_tools" or {f"{path}.py", f"{path}/__init__.py"} & set(names), m


# -- hostile input (adversarial review) ----------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    ["host-devices\n=ct200-host-devices.service", "host-devices=ct200-host-devices.service\n"],
)
def test_a_step_with_a_trailing_newline_is_refused(step: str) -> None:
    """`$` matches before a final newline: the name would break the shell script and the label."""
    with pytest.raises(hc.BadInput):
        hc.parse_step(step)


@pytest.mark.parametrize("key", ["InactiveExitTimestampMonotonic", "UserspaceTimestampMonotonic"])
def test_a_timestamp_of_non_ascii_digits_is_no_time_not_a_crash(key: str) -> None:
    """str.isdigit() is true for '²', which int() refuses: mutated `systemctl show` output."""
    unit = GOOD[0].replace("InactiveExitTimestampMonotonic=51500000", f"{key}=\u00b2")
    manager = MANAGER.replace(f"UserspaceTimestampMonotonic={ZERO}", f"{key}=\u00b2")

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        return 0, (manager if argv[-1].startswith("--property=") else unit + GOOD[1]), ""

    got = hc.read(ORDER, run)
    assert [s.state for s in got.steps] == ["ok", "ok"]


def test_output_that_is_not_utf8_is_read_not_a_crash() -> None:
    """journalctl --output=cat passes a unit's bytes through as they were logged (a line cut in
    the middle of a character): run_argv reads them with replacement characters."""
    code = "import sys; sys.stdout.buffer.write(b'nvidia: \\xe2\\x82 cut\\n'); sys.exit(3)"
    rc, out, _ = hc.run_argv([sys.executable, "-c", code], 30)
    assert rc == 3 and out == "nvidia: \ufffd cut\n"


PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
GOOD_STEPS = [{"name": "host-devices", "unit": "ct200-host-devices.service"}]


def role_in_check_mode(tmp_path: Path, **role_vars: object) -> subprocess.CompletedProcess[str]:
    """roles/host_boot_report in real ansible-playbook on localhost, in check mode, with every
    path the role writes redirected into tmp_path/out (unless role_vars names it)."""
    play = tmp_path / "play.yml"
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "tasks": [{"ansible.builtin.import_role": {"name": "host_boot_report"}}],
                }
            ]
        )
    )
    out = tmp_path / "out"
    extra = {
        "host_boot_report_steps": GOOD_STEPS,
        "host_boot_report_lib": str(out / "lib"),
        "host_boot_report_program": str(out / "ct200-host-chain"),
        "host_boot_report_unit_path": str(out / "unit.service"),
        "host_boot_report_textfile": str(out / "prom" / "x.prom"),
        "ansible_python_interpreter": sys.executable,
        **role_vars,
    }
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_NOCOLOR": "1",
    }
    return subprocess.run(
        [str(PLAYBOOK), "-i", "localhost,", str(play), "--check", "-e", f"@{tmp_path}/vars.json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
@pytest.mark.parametrize(
    "steps",
    [
        [{"name": "host-devices\n", "unit": "ct200-host-devices.service"}],
        [{"name": "host-devices", "unit": "ct200-host-devices.service\n"}],
    ],
)
def test_the_role_refuses_a_step_with_a_trailing_newline_before_any_change(
    tmp_path: Path, steps: list[dict[str, str]]
) -> None:
    """The role's assert: a newline would end ct200-host-chain's exec line."""
    proc = role_in_check_mode(tmp_path, host_boot_report_steps=steps)
    assert proc.returncode != 0, proc.stdout
    assert "host_boot_report_steps must list" in proc.stdout, proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("host_boot_report_textfile", "/var/lib/node exporter/x.prom"),
        ("host_boot_report_textfile", "/var/lib/prometheus/%H.prom"),
        ("host_boot_report_textfile", "ct200_host_boot.prom"),
        ("host_boot_report_python", "/usr/bin/python3 -I"),
    ],
)
def test_the_role_refuses_a_path_the_unit_or_script_would_split_before_any_change(
    tmp_path: Path, var: str, value: str
) -> None:
    """The textfile goes into ExecStart= and the python into the script as written: a space
    splits them (the report would exit 2 at every boot), % is a systemd specifier."""
    proc = role_in_check_mode(tmp_path, **{var: value})
    assert proc.returncode != 0, proc.stdout
    assert f"{var} must be an absolute path" in proc.stdout, proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_ct200_host_chain_runs_the_installed_modules_whatever_the_working_directory(
    tmp_path: Path,
) -> None:
    """`python -m` puts the working directory first on sys.path: root running ct200-host-chain in
    a directory with a ct200_tools/ of someone else's (/tmp) must still run the installed copy.
    The script is the role's template, rendered by real ansible-playbook."""
    lib = tmp_path / "lib"
    (lib / "ct200_tools").mkdir(parents=True)
    names = yaml.safe_load((REPO / "roles/host_boot_report/vars/main.yml").read_text())[
        "host_boot_report_modules"
    ]
    for name in names:
        (lib / "ct200_tools" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "ct200_tools" / name, lib / "ct200_tools" / name)
    script = tmp_path / "ct200-host-chain"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Render ct200-host-chain",
                    "ansible.builtin.template": {
                        "src": str(REPO / "roles/host_boot_report/templates/ct200-host-chain.j2"),
                        "dest": str(script),
                        "mode": "0755",
                    },
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    extra = {
        "host_boot_report_steps": GOOD_STEPS,
        "host_boot_report_lib": str(lib),
        "host_boot_report_python": sys.executable,
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    rendered = subprocess.run(
        [
            str(PLAYBOOK),
            "-i",
            "localhost,",
            str(tmp_path / "play.yml"),
            "-e",
            "@" + str(tmp_path / "vars.json"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**env, "ANSIBLE_NOCOLOR": "1"},
    )
    assert rendered.returncode == 0, rendered.stdout
    planted = tmp_path / "cwd" / "ct200_tools"
    (planted / "host").mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "host" / "__init__.py").write_text("")
    (planted / "host" / "chain.py").write_text("print('planted code ran')\n")
    proc = subprocess.run(
        [str(script), "--step", "a=b"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=planted.parent,
    )
    assert "planted code ran" not in proc.stdout
    assert proc.returncode == hc.Exit.BAD_INPUT and "NAME=UNIT" in proc.stderr, proc.stderr


def test_a_broken_run_still_rewrites_the_textfile_with_this_boots_id(tmp_path: Path) -> None:
    """Whatever fails, the host's report is this boot's: the last boot's `chain_ok 1` must not
    stand (issue 19)."""
    textfile = tmp_path / "ct200_host_boot.prom"
    textfile.write_text("ct200_boot_chain_ok 1\n")
    assert hc.main(["--textfile", str(textfile)]) == hc.Exit.BAD_INPUT
    text = textfile.read_text()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert "ct200_boot_chain_ok 0" in text
    assert 'ct200_boot_chain_reason{reason="bad input: no --step given' in text
    assert f'ct200_boot_report_info{{machine="host",boot_id="{boot}"}} 1' in text


def test_the_recover_command_is_whole_from_the_hosts_record(tmp_path: Path) -> None:
    """site.yml's host play records the inventory on the host too: the host chain's fix prints
    the whole recover.yml command, pasteable on the controller, not INVENTORY and HOST to fill
    in (issue 19's fault matrix: a host boot unit disabled or failing)."""
    record = tmp_path / "provisioned.json"
    record.write_text(
        json.dumps({"checkout": "/srv/ct200", "inventory": ["/srv/inv/h.yml"], "host": "pve-1"})
    )
    got = hc.read(ORDER, fake(DISABLED, GOOD[1])[0])
    assert got.stopped is not None
    fix = hc.fix_of(got.stopped, str(record))
    assert (
        "`cd /srv/ct200 && ansible-playbook -i /srv/inv/h.yml playbooks/recover.yml --limit "
        "pve-1,localhost --tags recover_host` on the controller"
    ) in fix, fix
    assert "INVENTORY" not in fix
    without = hc.fix_of(got.stopped, str(tmp_path / "none.json"))
    assert "INVENTORY" in without and "does not know them" in without
