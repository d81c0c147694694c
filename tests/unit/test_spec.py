"""The site spec: loading, every validation rule (with its path and fix), round trip, fuzzing."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ct200_tools.spec import (
    SPEC_KEY,
    SiteSpec,
    SpecError,
    SpecIssue,
    load_spec,
    parse_size,
    spec_to_dict,
    validate,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "inventory" / "ct200"
EXAMPLE_FILE = EXAMPLE_DIR / "group_vars" / "all" / "ct200_site.yml"
DROP = object()  # in a change table: delete the key


def example() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_FILE.read_text())[SPEC_KEY]
    assert isinstance(data, dict)
    return copy.deepcopy(data)


def tokens(path: str) -> list[str | int]:
    return [int(i) if i else k for k, i in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path)]


def changed(changes: dict[str, object]) -> dict[str, Any]:
    """The example with values set (or DROPped) at spec paths such as servers[1].gpus."""
    data = example()
    for path, value in changes.items():
        *head, last = tokens(path)
        target: Any = data
        for token in head:
            target = target[token]
        if value is DROP:
            del target[last]
        else:
            target[last] = value
    return data


def issues_of(data: object) -> list[SpecIssue]:
    with pytest.raises(SpecError) as caught:
        validate(data)
    return caught.value.issues


def issue_at(issues: list[SpecIssue], path: str, fragment: str, severity: str) -> SpecIssue:
    found = [i for i in issues if i.path == path and i.severity == severity]
    assert found, f"no {severity} at {path}; got: {[str(i) for i in issues]}"
    matching = [i for i in found if fragment in f"{i.message} {i.fix}"]
    assert matching, f"{fragment!r} not in {[str(i) for i in found]}"
    assert matching[0].fix.strip()
    return matching[0]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


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


def test_importing_specload_first_works() -> None:
    # spec.py and specload.py import each other; either may be imported first.
    code = "import ct200_tools.specload, ct200_tools.spec as s; print(s.validate.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "validate"


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
    pytest.param({"gpus.count": 0}, "gpus.count", "1..64", id="count-zero"),
    pytest.param({"gpus.count": 65}, "gpus.count", "1..64", id="count-too-big"),
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
            "servers[1].command": ["/bin/srv", "--x"],
            "servers[0].args.json-model-override-args": '{"a": 1}',
            "servers[0].args.ports": [1, 2],
            "models[0].staged": "/srv/qwen",  # a warning survives the trip too
        }
    )
    spec = validate(data)
    assert spec.servers[0].args["ports"] == (1, 2)
    assert validate(spec_to_dict(spec)) == spec


# --- loading -----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "nope.yml")
    assert caught.value.source.endswith("nope.yml")
    assert "no such file" in caught.value.issues[0].message
    assert caught.value.issues[0].fix


def test_yaml_error_has_line_and_column(tmp_path: Path) -> None:
    bad = write(tmp_path / "site.yml", "ct200_site:\n  gpus: {count: 8\n  shm: x\n")
    with pytest.raises(SpecError) as caught:
        load_spec(bad)
    assert re.search(r"line \d+, column \d+", caught.value.issues[0].message)
    assert caught.value.issues[0].fix


def test_duplicate_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    text = "ct200_site:\n  gpus: {count: 1, model: a}\n  gpus: {count: 2, model: b}\n"
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path / "site.yml", text))
    assert "duplicate key 'gpus'" in caught.value.issues[0].message
    assert "line 3" in caught.value.issues[0].message


def test_bare_spec_is_refused_with_the_key_to_add(tmp_path: Path) -> None:
    bare = write(tmp_path / "site.yml", yaml.safe_dump(example()))
    with pytest.raises(SpecError) as caught:
        load_spec(bare)
    assert "bare spec" in caught.value.issues[0].message
    assert SPEC_KEY in caught.value.issues[0].fix


def test_file_without_the_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="1 problem"):
        load_spec(write(tmp_path / "hosts.yml", "all: {hosts: {a: {}}}\n"))


def test_templated_values_are_refused_with_their_paths(tmp_path: Path) -> None:
    data = changed({"servers[0].host": "{{ ansible_host }}", "servers[1].port": 30000})
    site = write(tmp_path / "site.yml", yaml.safe_dump({SPEC_KEY: data}))
    with pytest.raises(SpecError) as caught:
        load_spec(site)
    issue_at(caught.value.issues, "servers[0].host", "templated", "error")
    issue_at(caught.value.issues, "servers[1].port", "servers[0]", "error")  # and the rest


def test_templated_value_in_an_otherwise_valid_spec(tmp_path: Path) -> None:
    data = changed({"gpus.model": "{% raw %}x{% endraw %}"})
    site = write(tmp_path / "site.yml", yaml.safe_dump({SPEC_KEY: data}))
    with pytest.raises(SpecError) as caught:
        load_spec(site)
    assert [i.path for i in caught.value.issues] == ["gpus.model"]


def test_inventory_ignores_host_vars_and_unparsable_unrelated_files(tmp_path: Path) -> None:
    write(tmp_path / "group_vars" / "all" / "site.yaml", EXAMPLE_FILE.read_text())
    write(tmp_path / "group_vars" / "pve.yml", "secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n")
    write(tmp_path / "host_vars" / "ct200-ct.yml", "ct200_site: {gpus: 1}\n")
    spec = load_spec(tmp_path)
    assert spec.source.endswith("site.yaml")


def test_inventory_with_two_definitions_names_both(tmp_path: Path) -> None:
    write(tmp_path / "group_vars" / "all.yml", EXAMPLE_FILE.read_text())
    write(tmp_path / "group_vars" / "ct" / "spec.yml", EXAMPLE_FILE.read_text())
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path)
    message = caught.value.issues[0].message
    assert "all.yml" in message
    assert "spec.yml" in message


def test_inventory_without_definition(tmp_path: Path) -> None:
    write(tmp_path / "group_vars" / "all.yml", "x: '{{ ct200_site.gpus }}'\n")
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path)
    assert "0 group_vars files" in caught.value.issues[0].message


def test_directory_without_group_vars(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path)
    assert "group_vars" in caught.value.issues[0].message


def test_self_referencing_yaml_is_an_error_not_a_hang(tmp_path: Path) -> None:
    site = write(tmp_path / "site.yml", "ct200_site: &a {gpus: *a, models: [*a]}\n")
    with pytest.raises(SpecError):
        load_spec(site)


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
