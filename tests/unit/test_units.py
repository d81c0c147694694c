"""ct200_tools/units.py, the one list of the units the project installs, and the one door from the
spec into Ansible: the validate play exports the list (ct200_validated.units, .host_chain), the
MRRS table and the device nodes, and every role reads them from there (real ansible-playbook on
localhost reading the roles' own defaults and vars), and no second source of a unit's name is
left in the package, the roles, the playbooks or the shared templates (docs and tests spell the
names out on purpose: they check this list)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ct200_tools import tunings, units
from ct200_tools.host import chain as hostchain
from ct200_tools.serve import chain
from ct200_tools.serve.serving import STATE_PATH
from ct200_tools.spec import DEFAULT_SPEC_PATH, MRRS_SIZES, load_spec, mrrs_code, validate
from tests.unit.spec_helpers import EXAMPLE_DIR, REPO, changed

PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


# -- the list ------------------------------------------------------------------------------------


def test_every_unit_once_with_its_role_and_a_place_in_its_machines_order() -> None:
    steps = [u.step for u in units.UNITS]
    prefixes = [u.prefix for u in units.UNITS]
    assert len(set(steps)) == len(steps) and len(set(prefixes)) == len(prefixes)
    for machine in ("host", "container"):
        orders = [u.order for u in units.UNITS if u.machine == machine]
        assert sorted(orders) == list(range(1, len(orders) + 1)), machine
        # The list is written in start order, the report after the chain's steps.
        assert orders == sorted(orders)
        mine = [u for u in units.UNITS if u.machine == machine]
        assert [u.chain for u in mine] == [True] * (len(mine) - 1) + [False]
    for u in units.UNITS:
        assert (REPO / "roles" / u.role / "tasks" / "main.yml").is_file(), u.role
        assert u.prefix.startswith("ct200-")


def test_the_names_the_docs_and_the_machines_know() -> None:
    """The names themselves are an interface (journals, alert rules, the runbook)."""
    assert [u.shown for u in units.UNITS] == [
        "ct200-host-devices.service",
        "ct200-pcie-tune.service",
        "ct200-host-boot-report.service",
        "ct200-stage@<model>.service",
        "ct200-server-<server>.service",
        "ct200-boot-report.service",
    ]
    assert units.STAGE.name("qwen3.6-27b") == "ct200-stage@qwen3.6-27b.service"
    assert units.SERVER.instance("ct200-server-qwen-tp4.service") == "qwen-tp4"
    assert units.SERVER.instance("ct200-stage@qwen.service") is None
    assert units.SERVER.instance("ct200-server-.service") is None
    assert units.by_step("pcie-tune") is units.PCIE_TUNE


@pytest.mark.parametrize(("unit", "instance"), [(units.SERVER, ""), (units.HOST_DEVICES, "x")])
def test_a_name_without_its_instance_or_with_one_too_many_is_refused(
    unit: units.Unit, instance: str
) -> None:
    with pytest.raises(ValueError, match=unit.step):
        unit.name(instance)


def test_an_unknown_step_names_the_steps() -> None:
    with pytest.raises(KeyError, match="host-devices, pcie-tune"):
        units.by_step("pcie")


@pytest.mark.parametrize(("mrrs", "on"), [(4096, True), (None, False)])
def test_the_spec_field_turns_a_unit_on(mrrs: int | None, on: bool) -> None:
    site = validate(changed({"tuning.pcie_max_read_request": mrrs}))
    assert units.turned_on(units.PCIE_TUNE, site) is on
    assert units.turned_on(units.HOST_DEVICES, site)
    assert units.export(site)["pcie-tune"]["enabled"] is on
    want = [{"name": "host-devices", "unit": "ct200-host-devices.service"}]
    want += [{"name": "pcie-tune", "unit": "ct200-pcie-tune.service"}] if on else []
    assert units.host_chain(site) == want


def test_no_models_no_staging_unit() -> None:
    site = validate(changed({"models": [], "servers": []}))
    assert not units.turned_on(units.STAGE, site)
    assert not units.turned_on(units.SERVER, site)
    assert units.turned_on(units.BOOT_REPORT, site)


def test_the_mrrs_table_is_the_config_space_encoding() -> None:
    """Device Control bits 14:12 hold log2(MRRS/128): the code of each size is its index."""
    assert MRRS_SIZES == (128, 256, 512, 1024, 2048, 4096)
    assert [mrrs_code(s) for s in MRRS_SIZES] == [0, 1, 2, 3, 4, 5]
    assert all(128 << mrrs_code(s) == s for s in MRRS_SIZES)
    with pytest.raises(ValueError):
        mrrs_code(8192)


def test_the_schema_accepts_exactly_the_table() -> None:
    from ct200_tools.spec import SpecError  # noqa: PLC0415 - beside its use

    for size in MRRS_SIZES:
        assert validate(changed({"tuning.pcie_max_read_request": size})).tuning
    for size in (64, 3000, 8192):
        with pytest.raises(SpecError) as caught:
            validate(changed({"tuning.pcie_max_read_request": size}))
        assert any("pcie_max_read_request" in i.path for i in caught.value.issues)


# -- no second source ----------------------------------------------------------------------------

#: A unit's name, written out: a fixed one with .service, a per-instance one by its prefix.
LITERAL = re.compile(
    "|".join(re.escape(u.name()) for u in units.UNITS if not u.per)
    + "|"
    + "|".join(re.escape(u.prefix) for u in units.UNITS if u.per)
)


def _python_literals(path: Path) -> list[tuple[int, str]]:
    """String constants that name a unit, docstrings and --help examples (documentation) aside."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and "Examples:" not in node.value
        and LITERAL.search(node.value)
    ]


#: A template or file the roles read by name (ct200_files' content), as src: is.
LOOKUP = re.compile(r"lookup\('ansible\.builtin\.(?:template|file)', '[^']*'")


def _ansible_literals(path: Path) -> list[tuple[int, str]]:
    """Lines that name a unit, comments, task names and template file names (src:, a lookup)
    aside."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text.startswith(("#", "- name:", "src:")):
            continue
        if LITERAL.search(LOOKUP.sub("", line)):
            out.append((n, text))
    return out


def _role_files() -> list[Path]:
    """The roles' files as the repository holds them: not the bytecode Ansible leaves beside a
    filter plugin it loaded (a playbook run, perhaps at the same time as this test)."""
    return [p for p in (REPO / "roles").rglob("*") if "__pycache__" not in p.parts]


def test_no_second_source_of_a_unit_name() -> None:
    found: dict[str, list[tuple[int, str]]] = {}
    for path in sorted((REPO / "ct200_tools").rglob("*.py")):
        if path.name != "units.py" and (hits := _python_literals(path)):
            found[str(path.relative_to(REPO))] = hits
    ansible = [*_role_files(), *(REPO / "playbooks").glob("*.yml")]
    ansible += [*(REPO / "templates").glob("*.j2")]
    for path in sorted(ansible):
        # meta/: the argument specs and galaxy_info are the roles' documentation.
        doc = not path.is_file() or path.suffix == ".py" or "meta" in path.parts
        if not doc and (hits := _ansible_literals(path)):
            found[str(path.relative_to(REPO))] = hits
    assert not found, json.dumps(found, indent=1)


def test_no_role_default_or_task_reads_the_raw_spec() -> None:
    """One door: the roles read ct200_validated. Only the tools role writes the user's spec to
    /etc/ct200/site.yml (that is data), and the server templates' input keeps its name."""
    allowed = {
        "roles/ct200_tools/tasks/spec.yml",  # writes the user's own text: data
        "roles/inference_servers/tasks/render.yml",  # ct200_site: the validated spec, as render.py
    }
    readers = []
    for path in sorted(_role_files()):
        if not path.is_file() or "meta" in path.parts or path.suffix == ".py":
            continue
        rel = str(path.relative_to(REPO))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "ct200_site" in line and not line.strip().startswith("#") and rel not in allowed:
                readers.append(f"{rel}:{n}: {line.strip()}")
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        if path.name == "validate.yml":
            continue
        text = path.read_text()
        readers += [
            f"{path.name}: ct200_site" for line in text.splitlines() if "ct200_site" in line
        ]
        # Every playbook that reads the spec validates it first.
        if "ct200_validated" in text or "import_role" in text:
            assert "import_playbook: validate.yml" in text, path.name
    assert not readers, "\n".join(readers)


# -- the export, read by the roles ---------------------------------------------------------------

#: Every role variable that names a unit or reads what the validate play exports.
ROLE_FILES = [
    "roles/host_devices/defaults/main.yml",
    "roles/host_devices/vars/main.yml",
    "roles/host_tuning/defaults/main.yml",
    "roles/host_tuning/vars/main.yml",
    "roles/host_boot_report/defaults/main.yml",
    "roles/host_boot_report/vars/main.yml",
    "roles/lxc_passthrough/defaults/main.yml",
    "roles/recover/defaults/main.yml",
    "roles/recover/vars/main.yml",
    "roles/boot_report/defaults/main.yml",
    "roles/boot_report/vars/main.yml",
    "roles/model_staging/defaults/main.yml",
    "roles/model_staging/vars/main.yml",
    "roles/ct200_tools/vars/main.yml",
    "roles/inference_servers/vars/main.yml",
]
ROLE_VARS = [
    "host_devices_unit",
    "host_devices_nodes",
    "host_tuning_unit",
    "host_tuning_after_unit",
    "host_tuning_sysctl",
    "host_tuning_pcie_max_read_request",
    "host_tuning_mrrs",
    "host_tuning_tunings",
    "host_tuning_sysfs",
    "host_tuning_tmpfiles_file",
    "host_boot_report_unit",
    "host_boot_report_steps",
    "lxc_passthrough_enabled",
    "lxc_passthrough_vmid",
    "lxc_passthrough_mode",
    "lxc_passthrough_devices",
    "recover_vmid",
    "recover_host_units",
    "recover_stage_prefix",
    "recover_server_prefix",
    "recover_report_unit",
    "boot_report_unit",
    "boot_report_stage_prefix",
    "boot_report_server_prefix",
    "model_staging_unit_prefix",
    "inference_servers_unit_prefix",
    "ct200_tools_spec_path",
    "ct200_tools_serving_file",
    "model_staging_spec",
    "boot_report_spec",
    "recover_spec",
    "boot_report_textfile",
    "host_boot_report_textfile",
]


def role_vars(
    tmp_path: Path, site: dict[str, Any], names: list[str] = ROLE_VARS
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the roles' variables, ct200_validated) after the validate play, for this ct200_site."""
    out = tmp_path / "out.json"
    content = "{{ {'vars': {" + ", ".join(f"'{v}': {v}" for v in names) + "},"
    content += " 'validated': hostvars['localhost'].ct200_validated} | to_json }}"
    plays = [
        {
            "name": "Validate",
            "ansible.builtin.import_playbook": str(REPO / "playbooks/validate.yml"),
        },
        {
            "name": "Read the roles' variables",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(REPO / f) for f in ROLE_FILES],
            "tasks": [
                {
                    "name": "Write them",
                    "ansible.builtin.copy": {"content": content, "dest": str(out), "mode": "0644"},
                }
            ],
        },
    ]
    (tmp_path / "play.yml").write_text(json.dumps(plays))
    (tmp_path / "vars.json").write_text(
        json.dumps({"ct200_site": site, "ansible_python_interpreter": sys.executable})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run(
        [
            str(PLAYBOOK),
            "-i",
            "localhost,",
            str(tmp_path / "play.yml"),
            "-e",
            f"@{tmp_path / 'vars.json'}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=REPO,
        env={**env, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    return got["vars"], got["validated"]


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_the_roles_read_the_list_the_table_and_the_nodes_from_the_validate_play(
    tmp_path: Path,
) -> None:
    site = changed({"tuning.pcie_max_read_request": 1024, "pve.passthrough": "raw-lxc"})
    got, validated = role_vars(tmp_path, site)
    spec = validate(site)
    assert validated["units"] == units.export(spec)
    assert validated["mrrs"] == [{"bytes": s, "code": mrrs_code(s)} for s in MRRS_SIZES]
    assert got == {
        "host_devices_unit": units.HOST_DEVICES.name(),
        "host_devices_nodes": list(spec.gpus.device_nodes),
        "host_tuning_unit": units.PCIE_TUNE.name(),
        "host_tuning_after_unit": units.HOST_DEVICES.name(),
        "host_tuning_sysctl": [
            {
                "key": "numa_balancing",
                "value": 0,
                "apply": "sysctl",
                "why": tunings.BY_KEY["numa_balancing"].why,
                "sysctl": "kernel.numa_balancing",
                "line": "kernel.numa_balancing = 0",
            }
        ],
        "host_tuning_pcie_max_read_request": 1024,
        "host_tuning_mrrs": validated["mrrs"],
        # The tunings' table with this spec's values, as roles/host_tuning applies them.
        "host_tuning_tunings": tunings.export(spec.tuning.plain()),
        "host_tuning_sysfs": [
            t
            for t in tunings.export(spec.tuning.plain())
            if t["apply"] == "sysfs" and t["value"] is not None
        ],
        "host_tuning_tmpfiles_file": tunings.TMPFILES_FILE,
        "host_boot_report_unit": units.HOST_BOOT_REPORT.name(),
        "host_boot_report_steps": units.host_chain(spec),
        "lxc_passthrough_enabled": True,
        "lxc_passthrough_vmid": 200,
        "lxc_passthrough_mode": "raw-lxc",
        "lxc_passthrough_devices": list(spec.gpus.device_nodes),
        "recover_vmid": 200,
        "recover_host_units": [units.HOST_DEVICES.name(), units.PCIE_TUNE.name()],
        "recover_stage_prefix": units.STAGE.prefix,
        "recover_server_prefix": units.SERVER.prefix,
        "recover_report_unit": units.BOOT_REPORT.name(),
        "boot_report_unit": units.BOOT_REPORT.name(),
        "boot_report_stage_prefix": units.STAGE.prefix,
        "boot_report_server_prefix": units.SERVER.prefix,
        "model_staging_unit_prefix": units.STAGE.prefix,
        "inference_servers_unit_prefix": units.SERVER.prefix,
        # Where ct200-tools reads and writes, as its code names it.
        "ct200_tools_spec_path": DEFAULT_SPEC_PATH,
        "ct200_tools_serving_file": STATE_PATH,
        "model_staging_spec": DEFAULT_SPEC_PATH,
        "boot_report_spec": DEFAULT_SPEC_PATH,
        "recover_spec": DEFAULT_SPEC_PATH,
        "boot_report_textfile": chain.TEXTFILE,
        "host_boot_report_textfile": hostchain.TEXTFILE,
    }
    assert len(got["host_devices_nodes"]) == load_spec(EXAMPLE_DIR).gpus.count + 3


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
def test_a_spec_without_a_container_or_mrrs_turns_both_off_in_the_roles(tmp_path: Path) -> None:
    """What the roles decide (pass the GPUs into a container, install and start the MRRS unit)
    is the spec package's answer, not Jinja's: pve and tuning.pcie_max_read_request unset."""
    from tests.unit.spec_helpers import DROP  # noqa: PLC0415 - beside its use

    # No container: nothing names its vmid or passthrough mode.
    names = [v for v in ROLE_VARS if not v.endswith(("_vmid", "_mode"))]
    got, validated = role_vars(tmp_path, changed({"pve": DROP, "tuning": DROP}), names)
    assert validated["site"]["pve"] is None
    assert got["lxc_passthrough_enabled"] is False
    assert got["host_tuning_pcie_max_read_request"] is None
    assert got["host_boot_report_steps"] == [
        {"name": "host-devices", "unit": "ct200-host-devices.service"}
    ]
    assert got["recover_host_units"] == ["ct200-host-devices.service"]
