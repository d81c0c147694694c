"""The site spec's values and rules: every validation rule (with its path and fix), sizes,
needed models, round trip, the package's import order, fuzzing. Reading files: test_spec_files.py.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import ct200_tools.spec as spec_pkg
from ct200_tools.spec import (
    SPEC_KEY,
    SiteSpec,
    SpecError,
    format_size,
    load_spec,
    model_to_dict,
    parse_size,
    spec_to_dict,
    validate,
)
from ct200_tools.spec.sizes import NoUnitError
from tests.unit.spec_helpers import (
    DROP,
    EXAMPLE_DIR,
    EXAMPLE_FILE,
    changed,
    example,
    issue_at,
    issues_of,
)

# --- the example site ------------------------------------------------------------------------


def test_example_loads_from_inventory_dir_and_file() -> None:
    from_dir, from_file = load_spec(EXAMPLE_DIR), load_spec(str(EXAMPLE_FILE))
    assert from_dir == from_file
    assert from_dir.source == str(EXAMPLE_FILE)
    assert from_dir.warnings == ()
    assert from_dir.gpus.count == 8
    assert from_dir.gpus.numa == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert from_dir.pve is not None
    assert (from_dir.pve.vmid, from_dir.pve.passthrough) == (200, "devn")
    assert from_dir.shm.size == 1200 << 30
    assert from_dir.shm.reserve_ram == 64 << 30
    assert [s.name for s in from_dir.enabled_servers] == ["qwen-tp4-ddtree", "qwen-tp4-dflash"]
    ddtree = from_dir.servers[0]
    assert ddtree.tp == 4
    assert ddtree.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert ddtree.speculative is not None
    assert ddtree.speculative.budget == 15
    eagle = from_dir.servers[3].speculative
    assert eagle is not None
    assert (eagle.num_steps, eagle.eagle_topk, eagle.num_draft_tokens) == (3, 1, 4)
    kimi = from_dir.model("kimi-k2.6")
    assert kimi is not None
    assert kimi.size == 595 << 30


def test_example_hosts_have_the_two_groups() -> None:
    hosts = yaml.safe_load((EXAMPLE_DIR / "hosts.yml").read_text())
    children = hosts["all"]["children"]
    assert set(children["pve"]["hosts"]) == {"ct200-pve"}
    assert set(children["ct"]["hosts"]) == {"ct200-ct"}


SPEC_DIR = Path(spec_pkg.__file__).parent


def spec_imports(module: str) -> list[tuple[str, bool]]:
    """The ct200_tools.spec modules `module` imports, each with whether at module level."""
    tree = ast.parse((SPEC_DIR / f"{module}.py").read_text())
    top = {id(node) for node in tree.body}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found += [(n, id(node) in top) for n in names if n.startswith("ct200_tools.spec")]
    return found


def test_spec_modules_import_in_one_direction_at_module_level() -> None:
    """No cycle: each module imports only modules before it in MODULES, and at module level
    (an import inside a function is how the old spec.py <-> specload.py cycle was hidden)."""
    assert sorted(spec_pkg.MODULES) == sorted(
        p.stem for p in SPEC_DIR.glob("*.py") if p.stem != "__init__"
    )
    for i, module in enumerate(spec_pkg.MODULES):
        earlier = {f"ct200_tools.spec.{m}" for m in spec_pkg.MODULES[:i]}
        for name, at_top in spec_imports(module):
            assert at_top, f"{module} imports {name} inside a function"
            assert name != "ct200_tools.spec", f"{module} imports the package, not a module"
            assert name in earlier or name.rsplit(".", 1)[0] in earlier, (
                f"{module} imports {name}, which is not before it in {spec_pkg.MODULES}"
            )


def test_each_spec_module_imports_alone_in_a_fresh_interpreter() -> None:
    # In dependency order, each module (and so the package) imports with nothing imported before.
    for module in spec_pkg.MODULES:
        code = f"import ct200_tools.spec.{module} as m; print(m.__name__)"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"ct200_tools.spec.{module}"


def test_public_names_of_the_old_module_still_import() -> None:
    from ct200_tools.spec import (  # noqa: PLC0415 - what every importer writes
        DEFAULT_SPEC_PATH,
        GpuSpec,
        ModelSpec,
        ServerSpec,
        SpecIssue,
    )

    assert DEFAULT_SPEC_PATH == "/etc/ct200/site.yml"
    assert {GpuSpec, ModelSpec, ServerSpec, SpecIssue} <= {
        getattr(spec_pkg, n) for n in spec_pkg.__all__
    }


# --- parse_size --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1200G", 1200 << 30),
        ("64G", 64 << 30),
        ("512M", 512 << 20),
        ("1.5T", 3 << 39),
        ("4096", 4096),
        (4096, 4096),
        ("64GiB", 64 << 30),
        ("64Gi", 64 << 30),
        ("8k", 8192),
        ("100B", 100),
        (" 2 G ", 2 << 30),
        ("0.1K", 103),  # fractions round up to a whole byte
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("junk", ["", "G", "12X", "1.2.3G", "-5G", "1e9", "12GB", "1 000", "12iB"])
def test_parse_size_rejects_junk_with_the_accepted_forms(junk: str) -> None:
    with pytest.raises(ValueError, match="1200G"):
        parse_size(junk)


@pytest.mark.parametrize("junk", [True, -1, 1.5, None])
def test_parse_size_rejects_non_sizes(junk: Any) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(junk)


UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50, "E": 60}


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(sorted(UNITS)),
    st.sampled_from(["", "i", "iB"]),
    st.booleans(),
)
def test_parse_size_round_trips(number: int, unit: str, suffix: str, lower: bool) -> None:
    text = f"{number}{unit.lower() if lower else unit}{suffix if unit else ''}"
    assert parse_size(text) == number << UNITS[unit]
    assert parse_size(number) == number


@given(st.text())
def test_parse_size_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        assert parse_size(text) >= 0


@pytest.mark.parametrize("bare", [1200, "1200", " 64 ", "1.5", 10**29])
def test_parse_size_with_unit_required_refuses_a_bare_number(bare: str | int) -> None:
    with pytest.raises(NoUnitError, match=r"has no unit, so it would mean .* bytes"):
        parse_size(bare, unit_required=True)


@pytest.mark.parametrize(
    ("text", "size"), [(0, 0), ("0", 0), ("1200B", 1200), ("1200G", 1200 << 30)]
)
def test_parse_size_with_unit_required_takes_units_and_zero(text: str | int, size: int) -> None:
    assert parse_size(text, unit_required=True) == size


def test_parse_size_refuses_an_int_too_long_to_print() -> None:
    with pytest.raises(ValueError, match="too large"):
        parse_size(10**5000)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, 0),
        (1200 << 30, "1200G"),
        (3 << 39, "1536G"),
        (103, "103B"),
        (4096, "4K"),
        (1 << 60, "1E"),
    ],
)
def test_format_size(size: int, text: str | int) -> None:
    assert format_size(size) == text


@given(st.integers(min_value=0, max_value=1 << 70))
def test_format_size_round_trips_with_a_unit(size: int) -> None:
    assert parse_size(format_size(size), unit_required=True) == size


# --- one failing fixture per rule --------------------------------------------------------------

ERRORS = [
    # keys and types anywhere
    pytest.param({"gpuz": {}}, "gpuz", "did you mean 'gpus'", id="unknown-root-key"),
    pytest.param({"servers[0].prot": 1}, "servers[0].prot", "'port'", id="unknown-nested-key"),
    pytest.param({"gpus.pcie.lanes": 16}, "gpus.pcie.lanes", "unknown key", id="unknown-pcie-key"),
    pytest.param({"gpus.count": DROP}, "gpus.count", "missing", id="missing-required"),
    pytest.param({"gpus": DROP}, "gpus", "missing", id="missing-gpus"),
    pytest.param({"gpus.count": True}, "gpus.count", "boolean", id="bool-is-not-int"),
    pytest.param({"servers[0].port": "30000"}, "servers[0].port", "without quotes", id="quoted"),
    pytest.param({"gpus.count": None}, "gpus.count", "null", id="null-required"),
    pytest.param({"tuning": [1]}, "tuning", "mapping", id="section-not-mapping"),
    pytest.param({"servers": {"a": 1}}, "servers", "list", id="servers-not-list"),
    # pve
    pytest.param({"pve.vmid": 99}, "pve.vmid", "100..999999999", id="vmid-range"),
    pytest.param({"pve.vmid": DROP}, "pve.vmid", "missing", id="vmid-missing"),
    pytest.param({"pve.passthrough": "rawlxc"}, "pve.passthrough", "raw-lxc", id="passthrough"),
    # gpus
    pytest.param({"gpus.count": -1}, "gpus.count", "0..64", id="count-negative"),
    pytest.param({"gpus.count": 65}, "gpus.count", "0..64", id="count-too-big"),
    # No GPU on the site (gpus.count: 0): a server or NUMA node naming one says so.
    pytest.param(
        {"gpus.count": 0, "gpus.numa": DROP}, "servers[0].gpus[0]", "no GPU", id="count-zero"
    ),
    pytest.param({"gpus.count": 0}, "gpus.numa[0][0]", "no GPU", id="count-zero-numa"),
    pytest.param({"gpus.model": DROP}, "gpus.model", "missing", id="model-missing"),
    pytest.param({"gpus.model": ""}, "gpus.model", "non-empty", id="model-empty"),
    pytest.param({"gpus.pcie.gen": 7}, "gpus.pcie.gen", "1..6", id="pcie-gen"),
    pytest.param({"gpus.pcie.width": 3}, "gpus.pcie.width", "16", id="pcie-width"),
    pytest.param(
        {"gpus.numa": [[0, 1, 2, 3], [3, 4, 5, 6, 7]]}, "gpus.numa[1][0]", "node 0", id="numa-dup"
    ),
    pytest.param(
        {"gpus.numa": [[0, 1, 2, 3], [4, 5, 6, 7, 8]]}, "gpus.numa[1][4]", "0..7", id="numa-range"
    ),
    pytest.param({"gpus.numa": [[0, 1, 2, 3], [4, 5]]}, "gpus.numa", "6, 7", id="numa-missing"),
    pytest.param({"gpus.numa": [[0, 1, 2, 3], 4]}, "gpus.numa[1]", "list", id="numa-node-type"),
    # tuning and shm
    pytest.param({"tuning.numa_balancing": 2}, "tuning.numa_balancing", "0..1", id="balancing"),
    pytest.param(
        {"tuning.pcie_max_read_request": 1000}, "tuning.pcie_max_read_request", "4096", id="mrrs"
    ),
    pytest.param({"shm.size": "lots"}, "shm.size", "1200G", id="shm-size-junk"),
    pytest.param({"shm.size": 0}, "shm.size", "is 0", id="shm-size-zero"),
    pytest.param({"shm.reserve_ram": 1.5}, "shm.reserve_ram", "size", id="reserve-float"),
    # models
    pytest.param({"models[0].name": "Qwen"}, "models[0].name", "lower-case", id="model-name"),
    pytest.param(
        {"models[1].name": "qwen3.6-27b"}, "models[1].name", "models[0]", id="model-name-dup"
    ),
    pytest.param({"models[0].source": "tank/x"}, "models[0].source", "absolute", id="relative"),
    pytest.param({"models[0].staged": "/dev/shm/../x"}, "models[0].staged", "'..'", id="dotdot"),
    pytest.param(
        {"models[0].staged": "/tank/models/Qwen3.6-27B"}, "models[0].staged", "overlap", id="same"
    ),
    pytest.param(
        {"models[0].staged": "/tank/models/Qwen3.6-27B/shm"},
        "models[0].staged",
        "overlap",
        id="staged-in-source",
    ),
    pytest.param(
        {"models[0].source": "/dev/shm/models/qwen3.6-27b/src"},
        "models[0].staged",
        "overlap",
        id="source-in-staged",
    ),
    pytest.param(
        {"models[1].staged": "/dev/shm/models/qwen3.6-27b"},
        "models[1].staged",
        "models[0].staged",
        id="staged-shared",
    ),
    pytest.param({"models[0].staged": "/dev/shm"}, "models[0].staged", "whole", id="staged-root"),
    pytest.param({"models[0].size": "54 gigs"}, "models[0].size", "not a size", id="model-size"),
    pytest.param({"models[0].name": DROP}, "models[0].name", "missing", id="model-no-name"),
    # servers
    pytest.param({"servers[1].name": "qwen-tp4-ddtree"}, "servers[1].name", "servers[0]", id="dup"),
    pytest.param({"servers[0].name": "Qwen TP4"}, "servers[0].name", "lower-case", id="name"),
    pytest.param({"servers[0].engine": "sglan"}, "servers[0].engine", "'sglang'", id="engine"),
    pytest.param({"servers[0].model": "qwen3.6"}, "servers[0].model", "qwen3.6-27b", id="model"),
    pytest.param({"servers[0].gpus": []}, "servers[0].gpus", "non-empty", id="gpus-empty"),
    pytest.param({"servers[0].gpus": [0, 1, 2, 8]}, "servers[0].gpus[3]", "0..7", id="gpu-range"),
    pytest.param({"servers[0].gpus": [0, 0, 1, 2]}, "servers[0].gpus[1]", "twice", id="gpu-dup"),
    pytest.param({"servers[0].gpus": [0, "1"]}, "servers[0].gpus[1]", "index", id="gpu-type"),
    pytest.param({"servers[0].tp": 8}, "servers[0].tp", "set tp: 4", id="tp-mismatch"),
    pytest.param({"servers[0].port": 0}, "servers[0].port", "1..65535", id="port-zero"),
    pytest.param({"servers[0].port": 70000}, "servers[0].port", "1..65535", id="port-big"),
    pytest.param({"servers[1].port": 30000}, "servers[1].port", "servers[0]", id="port-clash"),
    pytest.param({"servers[0].host": 127}, "servers[0].host", "string", id="host"),
    pytest.param({"servers[0].enabled": "yes"}, "servers[0].enabled", "boolean", id="enabled"),
    pytest.param({"servers[0].env": ["A=1"]}, "servers[0].env", "mapping", id="env-type"),
    pytest.param(
        {"servers[0].env.NCCL_PROTO": ["LL"]}, "servers[0].env.NCCL_PROTO", "list", id="env-list"
    ),
    pytest.param({"servers[0].env.X": {"a": 1}}, "servers[0].env.X", "mapping", id="env-map"),
    pytest.param({"servers[0].env.X": True}, "servers[0].env.X", "quote", id="env-bool"),
    pytest.param({"servers[0].env.1X": "a"}, "servers[0].env.1X", "variable", id="env-key"),
    pytest.param(
        {"servers[0].env.CUDA_VISIBLE_DEVICES": "0"},
        "servers[0].env.CUDA_VISIBLE_DEVICES",
        "gpus",
        id="env-reserved",
    ),
    pytest.param(
        {"servers[0].args.tp-size": 8}, "servers[0].args.tp-size", "own fields", id="arg-reserved"
    ),
    pytest.param({"servers[0].args.--x": 1}, "servers[0].args.--x", "dashes", id="arg-dashes"),
    pytest.param({"servers[0].args.x": {"a": 1}}, "servers[0].args.x", "JSON", id="arg-map"),
    pytest.param({"servers[0].args": "x"}, "servers[0].args", "mapping", id="args-type"),
    pytest.param(
        {"servers[0].engine": "command", "servers[0].speculative": DROP, "servers[0].args": DROP},
        "servers[0].command",
        "needs a command",
        id="command-missing",
    ),
    pytest.param({"servers[0].command": ["x"]}, "servers[0].command", "only", id="command-unused"),
    pytest.param(
        {"servers[0].engine": "command", "servers[0].command": ["x", [1]]},
        "servers[0].command",
        "list of strings",
        id="command-type",
    ),
    pytest.param(
        {"servers[0].engine": "command", "servers[0].command": ["x"], "servers[0].args": DROP},
        "servers[0].speculative",
        "engine: command",
        id="speculative-with-command",
    ),
    pytest.param(
        {"servers[2].enabled": True}, "servers[2].gpus", "'qwen-tp4-ddtree'", id="gpu-overlap"
    ),
    # speculative
    pytest.param(
        {"servers[3].speculative.eagle_topk": DROP},
        "servers[3].speculative",
        "classic SGLang launch AssertionError",
        id="eagle-partial",
    ),
    pytest.param(
        {"servers[0].speculative.algorithm": "EAGLE4"},
        "servers[0].speculative.algorithm",
        "EAGLE3",
        id="algorithm",
    ),
    pytest.param(
        {"servers[0].speculative.algorithm": DROP},
        "servers[0].speculative.algorithm",
        "missing",
        id="algorithm-missing",
    ),
    pytest.param(
        {"servers[3].speculative.draft_model": DROP},
        "servers[3].speculative.draft_model",
        "EAGLE3 needs a draft model",
        id="draft-missing",
    ),
    pytest.param(
        {"servers[0].speculative.draft_model": "drafts/x"},
        "servers[0].speculative.draft_model",
        "absolute",
        id="draft-relative",
    ),
    pytest.param(
        {"servers[1].speculative.budget": 15},
        "servers[1].speculative.budget",
        "only applies to DDTREE",
        id="budget-not-ddtree",
    ),
    pytest.param(
        {
            "servers[1].speculative.num_steps": 2,
            "servers[1].speculative.eagle_topk": 1,
            "servers[1].speculative.num_draft_tokens": 16,
        },
        "servers[1].speculative.num_steps",
        "DFLASH forces num_steps to 1",
        id="dflash-steps",
    ),
    pytest.param(
        {"servers[0].speculative.budget": 0},
        "servers[0].speculative.budget",
        "1..1024",
        id="budget-range",
    ),
    # sizes
    pytest.param({"shm.size": "40G"}, "shm.size", "54.0 GiB", id="models-exceed-shm"),
    # issue 9 section 3: a bare number is bytes, which nobody means
    pytest.param({"shm.size": 1200}, "shm.size", "1200G for GiB", id="shm-size-no-unit"),
    pytest.param({"shm.size": "1200"}, "shm.size", "1200 bytes", id="shm-size-no-unit-str"),
    pytest.param({"shm.reserve_ram": 64}, "shm.reserve_ram", "64G", id="reserve-no-unit"),
    pytest.param({"models[0].size": 54}, "models[0].size", "54 bytes", id="model-size-no-unit"),
    # issue 9 section 3: the persistent copy must survive a reboot
    pytest.param(
        {"models[0].source": "/dev/shm/persistent/qwen"},
        "models[0].source",
        "would not survive a reboot",
        id="source-on-dev-shm",
    ),
    pytest.param(
        {"models[0].source": "/run/models/qwen"}, "models[0].source", "/tank", id="source-on-run"
    ),
    pytest.param(
        {"models[0].source": "/var/run/q"}, "models[0].source", "RAM", id="source-on-var-run"
    ),
    # issue 9 section 3: a host is an address or a host name, nothing more
    pytest.param(
        {"servers[0].host": "0.0.0.0:30001"}, "servers[0].host", "port", id="host-with-port"
    ),
    pytest.param(
        {"servers[0].host": "300.1.1.1"}, "servers[0].host", "not a valid IP", id="host-octet"
    ),
    pytest.param({"servers[0].host": "http://0.0.0.0"}, "servers[0].host", "scheme", id="host-url"),
    pytest.param({"servers[0].host": "[::1]"}, "servers[0].host", "brackets", id="host-brackets"),
    pytest.param(
        {"servers[0].host": "fe80::1%eth0"}, "servers[0].host", "zone", id="host-ipv6-zone"
    ),
    pytest.param({"servers[0].host": "my host"}, "servers[0].host", "host name", id="host-space"),
    pytest.param({"servers[0].host": "-x.example"}, "servers[0].host", "host name", id="host-dash"),
    pytest.param({"servers[0].host": "a" * 254}, "servers[0].host", "host name", id="host-long"),
    # issue 9 section 3: a model does not draft for itself
    pytest.param(
        {"servers[1].speculative.draft_model": "/dev/shm/models/qwen3.6-27b"},
        "servers[1].speculative.draft_model",
        "own model qwen3.6-27b",
        id="draft-is-own-model",
    ),
    pytest.param(
        {"servers[1].speculative.draft_model": "/tank/models/Qwen3.6-27B/"},
        "servers[1].speculative.draft_model",
        "cannot draft for itself",
        id="draft-is-own-source",
    ),
    # issue 9 section 3: no line breaks into EnvironmentFiles and units
    pytest.param(
        {"servers[0].env.NCCL_PROTO": "LL\nLD_PRELOAD=/tmp/x.so"},
        "servers[0].env.NCCL_PROTO",
        "control character '\\n'",
        id="env-newline",
    ),
    pytest.param(
        {"servers[0].env.NCCL_ALGO": "Ring\r"}, "servers[0].env.NCCL_ALGO", "'\\r'", id="env-cr"
    ),
    pytest.param(
        {"servers[0].args.page-size": "1\nExecStartPre=/bin/sh"},
        "servers[0].args.page-size",
        "one line",
        id="arg-newline",
    ),
    pytest.param(
        {"servers[0].args.ports": ["1", "2\x00"]},
        "servers[0].args.ports[1]",
        "'\\x00'",
        id="arg-list-nul",
    ),
    pytest.param(
        {
            "servers[1].engine": "command",
            "servers[1].speculative": DROP,
            "servers[1].command": ["/bin/srv", "--x", "a\u2028b"],
        },
        "servers[1].command[2]",
        "control character",
        id="command-line-separator",
    ),
    # issue 11: what the server units need
    pytest.param(
        {"servers[1].engine": "vllm", "servers[1].speculative.algorithm": "DFLASH"},
        "servers[1].speculative.algorithm",
        "engine: vllm has no 'DFLASH' algorithm (it is sglang's)",
        id="vllm-dflash",
    ),
    pytest.param(
        {"servers[3].engine": "vllm", "servers[3].speculative.eagle_topk": 4},
        "servers[3].speculative.eagle_topk",
        "one chain",
        id="vllm-eagle-tree",
    ),
    pytest.param(
        {"servers[0].args.page-size": 16},
        "servers[0].args.page-size",
        "DDTREE requires page size 1",
        id="ddtree-page-size",
    ),
    pytest.param(
        {"servers[1].gpus": []},
        "servers[1].gpus",
        "only with engine: command",
        id="gpus-empty-sglang",
    ),
    pytest.param(
        {
            "servers[1].engine": "command",
            "servers[1].speculative": DROP,
            "servers[1].command": ["/bin/srv", "--port", "30001"],
            "servers[1].gpus": [],
            "servers[1].tp": 2,
        },
        "servers[1].tp",
        "gpus lists 0 GPU(s)",
        id="cpu-server-with-tp",
    ),
    pytest.param(
        {
            "servers[1].engine": "command",
            "servers[1].speculative": DROP,
            "servers[1].command": ["bin/srv", "--port", "30001"],
        },
        "servers[1].command[0]",
        "absolute path",
        id="command-relative",
    ),
    pytest.param({"servers[0].start_timeout": 30}, "servers[0].start_timeout", "60..", id="st"),
    pytest.param(
        {"servers[0].start_timeout": "1h"}, "servers[0].start_timeout", "integer", id="st-type"
    ),
    pytest.param(
        {"servers[0].health": "http://x/health"}, "servers[0].health", "HTTP path", id="health"
    ),
    pytest.param({"servers[0].health": "/a b"}, "servers[0].health", "spaces", id="health-sp"),
    pytest.param(
        {"servers[0].args.config": "/x.yaml"}, "servers[0].args.config", "own fields", id="cfg"
    ),
    pytest.param(
        {"servers[0].env.CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
        "servers[0].env.CUDA_DEVICE_ORDER",
        "gpus",
        id="env-device-order",
    ),
    pytest.param({"gpus.model": "RTX\tPRO"}, "gpus.model", "'\\t'", id="string-tab"),
    pytest.param(
        {"models[0].staged": "/dev/shm/models/q\x7f"}, "models[0].staged", "'\\x7f'", id="path-del"
    ),
]


@pytest.mark.parametrize(("changes", "path", "fragment"), ERRORS)
def test_rule_rejects_with_path_and_fix(
    changes: dict[str, object], path: str, fragment: str
) -> None:
    issue_at(issues_of(changed(changes)), path, fragment, "error")


def test_root_must_be_a_mapping() -> None:
    issue_at(issues_of([1, 2]), SPEC_KEY, "mapping", "error")


def test_overlap_names_both_servers_and_the_shared_gpus() -> None:
    issues = issues_of(changed({"servers[2].enabled": True}))
    first = issue_at(issues, "servers[2].gpus", "qwen-tp4-ddtree", "error")
    assert "'kimi-tp8'" in first.message
    assert "0, 1, 2, 3" in first.message
    second = issue_at(issues, "servers[2].gpus", "qwen-tp4-dflash", "error")
    assert "4, 5, 6, 7" in second.message


def test_shm_overflow_gives_both_figures_in_gib() -> None:
    issue = issue_at(issues_of(changed({"shm.size": "40G"})), "shm.size", "GiB", "error")
    assert "54.0 GiB" in issue.message
    assert "40.0 GiB" in issue.message
    assert "54G" in issue.fix


def test_shm_fit_counts_drafters_with_a_declared_size_and_ignores_disabled_servers() -> None:
    sized = changed({"models[1].size": "10G", "shm.size": "60G"})
    issue = issue_at(issues_of(sized), "shm.size", "64.0 GiB", "error")
    assert "qwen3.6-27b-dflash" in issue.message
    # Kimi (595G) is on disabled servers only: a 60G /dev/shm is enough without the drafter size.
    assert validate(changed({"shm.size": "60G"})).shm.size == 60 << 30


def test_multiple_errors_are_all_reported_at_once() -> None:
    data = changed(
        {
            "pve.vmid": 5,
            "gpus.pcie.gen": 9,
            "models[0].source": "relative",
            "servers[0].tp": 2,
            "servers[1].port": 30000,
            "servers[3].speculative.num_steps": DROP,
            "bogus": 1,
        }
    )
    paths = {i.path for i in issues_of(data) if i.severity == "error"}
    assert {
        "pve.vmid",
        "gpus.pcie.gen",
        "models[0].source",
        "servers[0].tp",
        "servers[1].port",
        "servers[3].speculative",
        "bogus",
    } <= paths


def test_spec_error_holds_only_errors() -> None:
    # The CLI prints each issue of a SpecError as an error; warnings wait for a valid spec.
    issues = issues_of(changed({"pve.vmid": 5, "servers[0].speculative.budget": DROP}))
    assert [i.path for i in issues] == ["pve.vmid"]


# --- warnings: the spec is accepted and says so ------------------------------------------------

WARNINGS = [
    pytest.param(
        {"servers[0].gpus": [2, 3, 4, 5], "servers[1].gpus": [6, 7]},
        "servers[0].gpus",
        "measured slower than TP4",
        id="tp-spans-numa",
    ),
    pytest.param(
        {"models[0].staged": "/srv/models/qwen"},
        "models[0].staged",
        "not under /dev/shm",
        id="staged-outside-shm",
    ),
    pytest.param(
        {"servers[0].speculative.budget": DROP},
        "servers[0].speculative",
        "budget",
        id="ddtree-without-budget",
    ),
    pytest.param(
        {"servers[0].speculative": {"algorithm": "ngram", "draft_model": "/x"}},
        "servers[0].speculative.draft_model",
        "ignored",
        id="ngram-draft-ignored",
    ),
    pytest.param(
        {"servers[0].speculative.draft_model": "/dev/shm/drafts/x"},
        "servers[0].speculative.draft_model",
        "reboot",
        id="draft-not-staged",
    ),
    pytest.param(
        {"models[0].source": "/tmp/models/qwen"},
        "models[0].source",
        "cleans at boot",
        id="source-in-tmp",
    ),
]


@pytest.mark.parametrize(("changes", "path", "fragment"), WARNINGS)
def test_rule_warns(changes: dict[str, object], path: str, fragment: str) -> None:
    spec = validate(changed(changes))
    issue_at(list(spec.warnings), path, fragment, "warning")


def test_numa_warning_only_for_enabled_servers() -> None:
    assert validate(example()).warnings == ()  # the disabled TP8 servers span both nodes


# --- accepted variations -----------------------------------------------------------------------


def test_defaults_and_coercions() -> None:
    data = changed(
        {
            "pve": DROP,
            "tuning": DROP,
            "shm": DROP,
            "gpus.numa": DROP,
            "gpus.pcie": None,
            "servers[0].env.OMP_NUM_THREADS": 8,
            "servers[0].speculative.algorithm": "ddtree",
            "servers[2].port": 30000,  # a disabled server may share a port
            "servers[3].tp": 8,
        }
    )
    spec = validate(data)
    assert spec.pve is None
    assert spec.tuning.numa_balancing == 0
    assert spec.tuning.pcie_max_read_request is None
    assert spec.shm.size is None
    assert spec.gpus.numa == ()
    assert spec.gpus.pcie is None
    server = spec.servers[0]
    assert server.env["OMP_NUM_THREADS"] == "8"
    assert server.speculative is not None
    assert server.speculative.algorithm == "DDTREE"
    assert (server.host, server.enabled, server.tp) == ("127.0.0.1", True, 4)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "localhost", "gpu-01.example.com", "node."],  # noqa: S104
)
def test_host_address_or_name_accepted(host: str) -> None:
    assert validate(changed({"servers[0].host": host})).servers[0].host == host


@pytest.mark.parametrize(
    ("changes", "want"),
    [
        ({"shm.reserve_ram": 0}, 0),
        ({"shm.reserve_ram": "0"}, 0),
        ({"shm.reserve_ram": "4096B"}, 4096),
        ({"shm.reserve_ram": "64Gi"}, 64 << 30),
    ],
)
def test_sizes_with_a_unit_or_zero_are_accepted(changes: dict[str, object], want: int) -> None:
    assert validate(changed(changes)).shm.reserve_ram == want


def test_control_characters_are_reported_everywhere_at_once() -> None:
    issues = issues_of(
        changed({"servers[0].env.A": "1\n", "servers[0].args.x": "2\n", "servers[1].env.B": "\x1b"})
    )
    paths = {i.path for i in issues if "control character" in i.message}
    assert paths == {"servers[0].env.A", "servers[0].args.x", "servers[1].env.B"}


def test_null_numa_balancing_means_unmanaged() -> None:
    assert validate(changed({"tuning.numa_balancing": None})).tuning.numa_balancing is None


@pytest.mark.parametrize("algorithm", ["NGRAM", "NEXTN", "nextn"])
def test_algorithms_without_drafter(algorithm: str) -> None:
    spec = validate(changed({"servers[1].speculative": {"algorithm": algorithm}}))
    assert spec.servers[1].speculative is not None
    assert spec.servers[1].speculative.draft_model is None


def test_command_engine() -> None:
    spec = validate(
        changed(
            {
                "servers[1].engine": "command",
                "servers[1].speculative": DROP,
                "servers[1].env": DROP,
                "servers[1].command": ["/usr/bin/llama-server", "--port", 30001],
            }
        )
    )
    assert spec.servers[1].command == ("/usr/bin/llama-server", "--port", "30001")


@pytest.mark.parametrize("port_arg", [["--port", "30001"], ["--port=30001"], ["-H", "[::]:30001"]])
def test_command_engine_on_the_cpu(port_arg: list[str]) -> None:
    """A server with no GPUs (the testbed's llama-server): engine command only, tp 0, no NUMA
    warning, no overlap with anyone, and no warning while the command names the port."""
    spec = validate(
        changed(
            {
                "servers[1].engine": "command",
                "servers[1].speculative": DROP,
                "servers[1].command": ["llama-server", *port_arg],
                "servers[1].gpus": [],
                "servers[2].enabled": True,
                "servers[2].port": 30002,
                "servers[0].enabled": False,
                "servers[1].health": "/health",
                "servers[1].start_timeout": 120,
            }
        )
    )
    cpu = spec.servers[1]
    assert (cpu.gpus, cpu.tp, cpu.health, cpu.start_timeout) == ((), 0, "/health", 120)
    # Kimi's TP8 spans the nodes (warned); the CPU server has no warning of its own.
    assert [w.path for w in spec.warnings] == ["servers[2].gpus"]


def test_round_trip_of_a_cpu_server() -> None:
    data = changed(
        {
            "servers[1].engine": "command",
            "servers[1].speculative": DROP,
            "servers[1].command": ["llama-server", "--port", "30001"],
            "servers[1].gpus": [],
        }
    )
    spec = validate(data)
    assert validate(spec_to_dict(spec)) == dataclasses.replace(spec, source="")
    assert issue_at(issues_of(changed({"servers[0].tp": 0})), "servers[0].tp", "tp is 0", "error")


def test_vllm_takes_the_algorithms_it_has() -> None:
    spec = validate(changed({"servers[3].engine": "vllm", "servers[3].enabled": False}))
    assert spec.servers[3].engine == "vllm"
    assert spec.server("kimi-tp8-eagle3") == spec.servers[3]
    assert spec.server("nope") is None


# --- the models the enabled servers need --------------------------------------------------------


def test_needed_models_of_the_example_are_qwen_and_its_drafter() -> None:
    # Kimi (595 GB) and its drafter belong to disabled servers: not staged at every boot.
    spec = validate(example())
    assert [m.name for m in spec.needed_models()] == ["qwen3.6-27b", "qwen3.6-27b-dflash"]


def test_needed_models_follow_the_enabled_servers_in_spec_order() -> None:
    spec = validate(
        changed(
            {
                "servers[0].enabled": False,
                "servers[1].enabled": False,
                "servers[3].enabled": True,
                # the drafter declared before the model: spec order, not server order
                "models": list(reversed(example()["models"])),
            }
        )
    )
    assert [m.name for m in spec.needed_models()] == ["kimi-k2.6-eagle3", "kimi-k2.6"]


def test_needed_models_leave_out_an_undeclared_drafter_and_other_models() -> None:
    spec = validate(
        changed(
            {
                "servers[0].speculative.draft_model": "/srv/drafts/x",
                "servers[1].speculative": {"algorithm": "NGRAM"},
            }
        )
    )
    assert [m.name for m in spec.needed_models()] == ["qwen3.6-27b"]
    assert validate(changed({"servers": []})).needed_models() == ()


def test_needed_models_of_given_servers_follow_spec_order() -> None:
    """A serving set other than the enabled flags (a switch): the models of those servers."""
    spec = validate(example())
    kimi = [s for s in spec.servers if s.name == "kimi-tp8-eagle3"]
    assert [m.name for m in spec.needed_models(kimi)] == ["kimi-k2.6", "kimi-k2.6-eagle3"]
    assert [m.name for m in spec.needed_models(spec.servers[2:3])] == ["kimi-k2.6"]
    assert spec.needed_models([]) == ()
    assert spec.needed_models(spec.enabled_servers) == spec.needed_models()


def test_model_to_dict_writes_the_size_with_its_unit() -> None:
    kimi = load_spec(EXAMPLE_DIR).model("kimi-k2.6")
    assert kimi is not None
    assert model_to_dict(kimi) == {
        "name": "kimi-k2.6",
        "source": "/tank/models/Kimi-K2.6",
        "staged": "/dev/shm/models/kimi-k2.6",
        "size": "595G",
    }


# --- round trip --------------------------------------------------------------------------------


def without_source(spec: SiteSpec) -> SiteSpec:
    return dataclasses.replace(spec, source="")


def test_round_trip_of_the_example() -> None:
    spec = load_spec(EXAMPLE_DIR)
    plain = spec_to_dict(spec)
    assert yaml.safe_load(yaml.safe_dump({SPEC_KEY: plain}))[SPEC_KEY] == plain
    assert validate(plain) == without_source(spec)


def test_round_trip_with_nulls_lists_and_a_command_server() -> None:
    data = changed(
        {
            "pve": DROP,
            "gpus.numa": DROP,
            "tuning.numa_balancing": None,
            "servers[1].engine": "command",
            "servers[1].speculative": DROP,
            "servers[1].command": ["/bin/srv", "--x", "--port", "30001"],
            "servers[0].args.json-model-override-args": '{"a": 1}',
            "servers[0].args.ports": [1, 2],
            "models[0].staged": "/srv/qwen",  # a warning survives the trip too
        }
    )
    spec = validate(data)
    assert spec.servers[0].args["ports"] == (1, 2)
    assert validate(spec_to_dict(spec)) == spec


def test_round_trip_writes_sizes_with_units_that_need_them() -> None:
    plain = spec_to_dict(validate(changed({"shm.reserve_ram": 0, "models[1].size": "1.5K"})))
    shm, models = plain["shm"], plain["models"]
    assert isinstance(shm, dict) and isinstance(models, list)
    assert shm == {"size": "1200G", "reserve_ram": 0}
    assert [m["size"] for m in models] == ["54G", "1536B", "595G", None]


# --- fuzzing: only SpecError, never another exception -----------------------------------------

SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=12) | st.floats()
KEYS = st.sampled_from(
    ["gpus", "count", "numa", "servers", "name", "gpus", "port", "tp", "speculative", "x"]
) | st.text(max_size=8)
DATA = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=30,
)


def paths_of(value: object, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, (*prefix, index))
    return found


EXAMPLE_PATHS = paths_of(example())


def validate_or_spec_error(data: object) -> None:
    try:
        spec = validate(data)
    except SpecError as exc:
        assert exc.issues
        assert all(i.path and i.message and i.fix for i in exc.issues)
        assert any(i.severity == "error" for i in exc.issues)
    else:
        assert isinstance(spec, SiteSpec)


@settings(max_examples=300)
@given(DATA)
def test_validate_arbitrary_data(data: object) -> None:
    validate_or_spec_error(data)


@settings(max_examples=300)
@given(st.sampled_from(EXAMPLE_PATHS), DATA)
def test_validate_example_with_one_value_replaced(
    path: tuple[str | int, ...], value: object
) -> None:
    data: Any = example()
    target = data
    for token in path[:-1]:
        target = target[token]
    target[path[-1]] = value
    validate_or_spec_error(data)


@pytest.mark.parametrize("port_arg", [["--port", "30002"], [], ["--port=300011"]])
def test_a_command_that_does_not_pass_the_port_is_an_error(port_arg: list[str]) -> None:
    """Issue 33: a warning let the play wait the whole start timeout on a port nothing listens
    on, and blame the timeout; now validation refuses it before anything changes."""
    issues = issues_of(
        changed(
            {
                "servers[1].engine": "command",
                "servers[1].speculative": DROP,
                "servers[1].env": DROP,
                "servers[1].command": ["/usr/bin/llama-server", *port_arg],
            }
        )
    )
    issue_at(issues, "servers[1].command", "no argument of the command is the port 30001", "error")
