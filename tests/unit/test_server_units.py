"""The server units: rendered by Ansible and by ct200_tools.serve.render to the same bytes, clean
under systemd-analyze verify for every engine and speculative variant, and saying what issue 11
asks.

Ansible renders through the inference_servers role's own render tasks (real ansible-playbook on
localhost, into a temporary directory); systemd-analyze runs here, in a scratch root with named
stand-ins for the programs (testbed/units.py). That the running units do what they say is
tests/testbed/test_servers.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.serve import engines as engine
from ct200_tools.serve.render import Rendered, render
from ct200_tools.spec import SPEC_KEY, SiteSpec, load_spec, validate
from testbed import units
from testbed.units import unquote
from tests.server_sites import TRICKY_ALIAS, VARIANTS, llama_site, variant
from tests.unit.spec_helpers import EXAMPLE_DIR, REPO, example

PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
ANALYZE = shutil.which("systemd-analyze")


def local(argv: Sequence[str]) -> tuple[int, str, str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def rendered(site: SiteSpec) -> dict[str, Rendered]:
    return {s.name: render(site, s.name) for s in site.servers}


def exec_words(unit: str, key: str) -> list[list[str]]:
    lines = [m.group(1) for m in re.finditer(rf"^{key}=[+]?(.*)$", unit, re.MULTILINE)]
    return [unquote(line) for line in lines]


def directives(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


# -- Ansible and Python write the same bytes ----------------------------------------------------


def ansible_render(tmp_path: Path, site: dict[str, Any] | None) -> dict[str, str]:
    """The inference_servers role's render tasks, as the container play runs them, into
    tmp_path; the play ends before the handler would reload systemd on this controller."""
    unit_dir, config_dir = tmp_path / "units", tmp_path / "servers"
    unit_dir.mkdir()
    config_dir.mkdir()
    plays = [
        {
            "name": "Validate",
            "ansible.builtin.import_playbook": str(REPO / "playbooks/validate.yml"),
        },
        {
            "name": "Render",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Render the server units",
                    "ansible.builtin.import_role": {
                        "name": "inference_servers",
                        "tasks_from": "render.yml",
                    },
                },
                {"name": "End before the handlers", "ansible.builtin.meta": "end_play"},
            ],
        },
    ]
    play = tmp_path / "play.yml"
    play.write_text(json.dumps(plays))
    extra: dict[str, Any] = {
        "inference_servers_unit_dir": str(unit_dir),
        "inference_servers_config_dir": str(config_dir),
        "inference_servers_config_group": "root",
    }
    if site is not None:
        extra[SPEC_KEY] = site
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    proc = subprocess.run(
        [str(PLAYBOOK), "-i", str(EXAMPLE_DIR), str(play), "-e", f"@{tmp_path / 'extra.json'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    files = {f"/etc/systemd/system/{p.name}": p.read_text() for p in unit_dir.iterdir()}
    files |= {f"{engine.CONFIG_DIR}/{p.name}": p.read_text() for p in config_dir.iterdir()}
    return files


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes root-owned files")
@pytest.mark.parametrize("which", ["ct200", "testbed"])
def test_ansible_and_python_render_the_same_bytes(tmp_path: Path, which: str) -> None:
    raw = None if which == "ct200" else llama_site()
    site = load_spec(EXAMPLE_DIR) if raw is None else validate(raw)
    want: dict[str, str] = {}
    for s in site.servers:
        want |= rendered(site)[s.name].files(s.name)
    got = ansible_render(tmp_path, raw)
    assert sorted(got) == sorted(want)
    for path, text in want.items():
        assert got[path] == text, path
    # Every server has its unit and EnvironmentFile; SGLang servers their --config.
    assert len(want) == 2 * len(site.servers) + sum(s.engine == "sglang" for s in site.servers)


# -- systemd-analyze verify ------------------------------------------------------------------------


def all_units() -> dict[str, str]:
    """Every server of the example (disabled ones too), of the testbed site, and each variant."""
    out: dict[str, str] = {}
    for site in (load_spec(EXAMPLE_DIR), validate(llama_site())):
        out |= {engine.unit_name(n): r.unit for n, r in rendered(site).items()}
    for name, changes in VARIANTS:
        site = validate(variant(changes))
        out[f"ct200-server-{name}.service"] = render(site, "qwen-tp4-dflash").unit
    return out


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_every_rendered_unit_verifies_without_a_word() -> None:
    found = all_units()
    assert len(found) == 4 + len(llama_site()["servers"]) + len(VARIANTS)
    problems = units.verify_rendered(found, local)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_verify_rendered_reports_a_unit_systemd_would_reject() -> None:
    """The check can fail: a misspelt key is only a warning to systemd-analyze (exit 0)."""
    good = render(load_spec(EXAMPLE_DIR), "kimi-tp8").unit
    bad = good.replace("KillMode=control-group", "KillMod=control-group")
    problems = units.verify_rendered({"a.service": good, "b.service": bad}, local)
    assert [p.unit for p in problems] == ["b.service"]
    assert "KillMod" in problems[0].output


def test_programs_are_what_exec_lines_run() -> None:
    unit = render(validate(variant(dict(VARIANTS)["command-gpu"])), "qwen-tp4-dflash").unit
    assert units.programs(unit) == [
        "/opt/ct200/venv/bin/ct200-doctor",
        "/opt/ct200/venv/bin/ct200-serve",
        "/usr/bin/systemctl",
        "llama-server",
    ]


# -- what the units say ----------------------------------------------------------------------------


def test_sglang_unit_of_the_example() -> None:
    site = load_spec(EXAMPLE_DIR)
    files = render(site, "qwen-tp4-ddtree")
    d = directives(files.unit)
    assert d["ExecStart"] == [
        "/usr/bin/python3 -m sglang.launch_server --config /etc/ct200/servers/qwen-tp4-ddtree.yaml"
    ]
    assert d["Environment"] == [
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=0,1,2,3",
        "HOME=/var/cache/ct200/servers/qwen-tp4-ddtree",
    ]
    assert (d["NUMAPolicy"], d["NUMAMask"], d["CPUAffinity"]) == (["bind"], ["0"], ["numa"])
    stages = "ct200-stage@qwen3.6-27b.service ct200-stage@qwen3.6-27b-dflash.service"
    assert d["Wants"] == [f"{stages} network-online.target"]
    assert d["After"] == [f"{stages} network-online.target"]
    assert d["ExecStartPre"] == [
        "/opt/ct200/venv/bin/ct200-serve preflight qwen-tp4-ddtree --spec /etc/ct200/site.yml",
        "+/opt/ct200/venv/bin/ct200-doctor gate qwen-tp4-ddtree --spec /etc/ct200/site.yml",
    ]
    assert d["NotifyAccess"] == ["exec"]
    assert d["ExecStartPost"] == [
        "/opt/ct200/venv/bin/ct200-serve wait-ready qwen-tp4-ddtree --spec /etc/ct200/site.yml "
        "--timeout 540",
        # Serving: the start limit counts failed starts in a row only (issue 19).
        "+/usr/bin/systemctl reset-failed ct200-server-qwen-tp4-ddtree.service",
    ]
    one = {k: v[0] for k, v in d.items() if len(v) == 1}
    assert one["Type"] == "exec" and one["User"] == "ct200" and one["Group"] == "ct200"
    assert one["TimeoutStartSec"] == "600" and one["TimeoutStopSec"] == "120"
    assert one["Restart"] == "on-failure" and one["RestartSec"] == "10"
    assert one["StartLimitBurst"] == "3" and one["StartLimitIntervalSec"] == str(3 * 610)
    assert one["KillMode"] == "control-group" and one["LimitMEMLOCK"] == "infinity"
    assert one["NoNewPrivileges"] == "yes" and "PrivateDevices" not in d
    assert "DevicePolicy" not in d and "DeviceAllow" not in d
    assert one["EnvironmentFile"] == "/etc/ct200/servers/qwen-tp4-ddtree.env"
    assert one["WantedBy"] == "multi-user.target"
    assert files.config is not None
    config = yaml.safe_load(files.config)
    assert config == {
        "model-path": "/dev/shm/models/qwen3.6-27b",
        "tp-size": 4,
        "host": "127.0.0.1",
        "port": 30000,
        "served-model-name": "qwen3.6-27b",
        "speculative-algorithm": "DDTREE",
        "speculative-draft-model-path": "/dev/shm/models/qwen3.6-27b-dflash",
        "speculative-ddtree-budget": 15,
        "page-size": 1,
    }
    env = [line for line in files.env.splitlines() if not line.startswith("#")]
    assert env == ['NCCL_PROTO="LL"', 'NCCL_ALGO="Ring"']
    assert "NCCL's docs file it under debugging" in files.env


def test_kimi_spans_both_nodes_and_gets_a_start_timeout_for_595g() -> None:
    site = load_spec(EXAMPLE_DIR)
    d = directives(render(site, "kimi-tp8-eagle3").unit)
    assert d["NUMAMask"] == ["0,1"]
    # 300 s + 3 s per GiB of 595 GiB, in whole minutes; the unsized drafter counts nothing.
    assert d["TimeoutStartSec"] == ["2100"]
    assert d["ExecStartPost"][0].endswith("--timeout 1890")
    config = yaml.safe_load(render(site, "kimi-tp8-eagle3").config or "")
    assert {k: v for k, v in config.items() if k.startswith("speculative")} == {
        "speculative-algorithm": "EAGLE3",
        "speculative-draft-model-path": "/dev/shm/models/kimi-k2.6-eagle3",
        "speculative-num-steps": 3,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": 4,
    }
    assert config["trust-remote-code"] is True and config["tp-size"] == 8


@pytest.mark.parametrize(("name", "changes"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_each_variant_runs_what_the_spec_says(name: str, changes: dict[str, object]) -> None:
    site = validate(variant(changes))
    server = site.server("qwen-tp4-dflash")
    assert server is not None
    files = render(site, server.name)
    (argv,) = exec_words(files.unit, "ExecStart")
    assert argv == engine.argv(site, server)
    d = directives(files.unit)
    if server.engine == "sglang":
        config = yaml.safe_load(files.config or "")
        assert config["model-path"] == "/dev/shm/models/qwen3.6-27b"
        spec = server.speculative
        assert config.get("speculative-algorithm") == (spec.algorithm if spec else None)
        if spec is not None and spec.num_steps is not None:
            assert config["speculative-num-steps"] == spec.num_steps
    else:
        assert files.config is None
    if server.engine == "vllm":
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        if server.speculative is not None:
            spec_json = json.loads(argv[argv.index("--speculative-config") + 1])
            assert spec_json["method"] == engine.VLLM_METHODS[server.speculative.algorithm]
    if not server.gpus:
        assert d["Environment"][0] == "CUDA_VISIBLE_DEVICES="
        assert "NUMAPolicy" not in d
    elif name == "sglang-no-numa":
        assert "NUMAPolicy" not in d and "CUDA_VISIBLE_DEVICES=4,5,6,7" in d["Environment"]
    elif name == "sglang-spans-numa":
        assert d["NUMAMask"] == ["0,1"]
    else:
        assert d["NUMAMask"] == ["1"]


def test_vllm_speculative_config_is_one_json_word() -> None:
    site = validate(variant(dict(VARIANTS)["vllm-eagle3"]))
    unit = render(site, "qwen-tp4-dflash").unit
    (argv,) = exec_words(unit, "ExecStart")
    words = argv[argv.index("--speculative-config") + 1]
    assert json.loads(words) == {
        "method": "eagle3",
        "model": "/dev/shm/models/qwen3.6-27b-dflash",
        "num_speculative_tokens": 3,
    }
    assert argv[argv.index("--max-model-len") + 1] == "32768"
    assert "--enforce-eager" in argv and "--no-no-x" in argv


def test_args_and_env_reach_the_engine_as_written() -> None:
    site = validate(variant(dict(VARIANTS)["sglang-args-and-env"]))
    files = render(site, "qwen-tp4-dflash")
    config = yaml.safe_load(files.config or "")
    assert config["served-model-name"] == "qwen"
    assert config["cuda-graph-bs"] == [1, 2, 4, 8]
    assert config["chat-template"] == "/etc/templates/a b.jinja"
    assert config["enable-torch-compile"] is False
    (argv,) = exec_words(files.unit, "ExecStart")
    assert argv[0] == "/opt/sglang-ddtree/bin/python"
    assert directives(files.unit)["TimeoutStartSec"] == ["3600"]
    assert 'X="\\$a%b"' in files.env.splitlines()


def test_command_argv_survives_systemd_quoting() -> None:
    site = validate(variant(dict(VARIANTS)["command-gpu"]))
    (argv,) = exec_words(render(site, "qwen-tp4-dflash").unit, "ExecStart")
    assert argv == ["llama-server", "--alias", TRICKY_ALIAS, "--port", "30001"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=40))
def test_exec_arg_round_trips(text: str) -> None:
    assert unquote(engine.exec_line(["/bin/x", text])) == ["/bin/x", text]


@pytest.mark.parametrize("program", ["-x", "@x", "+x", "!x"])
def test_a_program_that_looks_like_a_prefix_is_quoted(program: str) -> None:
    assert engine.exec_line([program]) == f'"{program}"'


def test_env_file_line_escapes_what_systemd_would_expand() -> None:
    assert engine.env_file_line("A", 'x "y" $Z `w` \\') == 'A="x \\"y\\" \\$Z \\`w\\` \\\\"'


def test_start_timeout_without_sizes_and_with_the_spec_value() -> None:
    data = example()
    for m in data["models"]:
        m.pop("size", None)
    site = validate(data)
    server = site.servers[0]
    assert engine.start_timeout(site, server) == engine.START_UNKNOWN_S
    assert engine.ready_timeout(site, server) == engine.START_UNKNOWN_S - 180
    data["servers"][0]["start_timeout"] = 90
    site = validate(data)
    assert engine.start_timeout(site, site.servers[0]) == 90
    assert engine.ready_timeout(site, site.servers[0]) == 80


def test_connect_host_and_urls() -> None:
    site = validate(variant({"servers[1].host": "::"}))
    server = site.servers[1]
    assert engine.ready_url(server) == "http://[::1]:30001/health_generate"
    assert engine.connect_host("0.0.0.0") == "127.0.0.1"  # noqa: S104 - the spec's bind address
    assert engine.connect_host("10.0.0.5") == "10.0.0.5"


def test_wheel_carries_the_templates() -> None:
    """render() reads ct200_tools/templates, which is the top-level templates/ (a link)."""
    link = REPO / "ct200_tools" / "templates"
    assert link.is_symlink() and link.resolve() == (REPO / "templates").resolve()
    assert sorted(p.name for p in (REPO / "templates").glob("*.j2")) == [
        "ct200-server.env.j2",
        "ct200-server.service.j2",
        "ct200-server.yaml.j2",
    ]
