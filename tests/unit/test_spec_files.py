"""Reading the site spec: files and inventories, YAML (merge keys, duplicate keys), bounded input
(size, aliases), encodings, and the one resolver both CLIs use to choose the spec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ct200_tools.spec import (
    MAX_BYTES,
    MAX_NODES,
    SPEC_KEY,
    SpecChoice,
    SpecError,
    find_spec,
    load_spec,
)
from ct200_tools.spec import files as spec_files
from ct200_tools.spec.schema import MAX_ENTRIES
from tests.unit.spec_helpers import EXAMPLE_DIR, EXAMPLE_FILE, changed, example, issue_at, write

CT200 = str(EXAMPLE_DIR)
FACTS = EXAMPLE_DIR.parents[1] / "tests" / "fixtures" / "facts" / "ct200-ct-healthy.json"


def run(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """ct200-doctor or ct200-stage as a user runs it, without CT200_SPEC unless given."""
    base = {k: v for k, v in os.environ.items() if k != "CT200_SPEC"}
    return subprocess.run(
        [sys.executable, "-c", f"from {module} import main; main()", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**base, **(env or {})},
        cwd=EXAMPLE_DIR.parents[1],
    )


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run("ct200_tools.cli.doctor", *args, env=env)


def stage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run("ct200_tools.cli.stage", *args, env=env)


def refused(path: Path | str) -> str:
    """The one issue load_spec refuses the file with, as text."""
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert len(caught.value.issues) == 1, caught.value.issues
    issue = caught.value.issues[0]
    assert issue.fix.strip()
    return f"{issue.message} (fix: {issue.fix})"


def bytes_read() -> int:
    """Bytes this process has read through read(2) and friends so far (/proc/self/io rchar)."""
    text = Path("/proc/self/io").read_text()
    return int(re.search(r"^rchar: (\d+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]


# --- files and inventories ---------------------------------------------------------------------


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


# --- merge keys: valid YAML that operators use to share server settings -------------------------

MERGED = """\
ct200_site:
  gpus: {count: 8, model: RTX PRO 6000}
  models:
    - {name: qwen, source: /tank/models/qwen, staged: /dev/shm/models/qwen}
  servers:
    - &tp4
      name: qwen-a
      engine: sglang
      model: qwen
      gpus: [0, 1, 2, 3]
      port: 30000
      env: &nccl {NCCL_PROTO: LL, NCCL_ALGO: Ring}
    - <<: *tp4
      name: qwen-b
      gpus: [4, 5, 6, 7]
      port: 30001
    - <<: [*tp4]
      name: qwen-c
      enabled: false
      port: 30002
      env: {<<: *nccl, NCCL_ALGO: Tree}
"""


def test_merge_keys_share_server_settings_and_explicit_keys_win(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path / "site.yml", MERGED))
    a, b, c = spec.servers
    assert (b.name, b.engine, b.model, b.gpus, b.port) == (
        "qwen-b",
        "sglang",
        "qwen",
        (4, 5, 6, 7),
        30001,
    )
    assert b.env == a.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert (c.name, c.enabled, c.gpus, c.port) == ("qwen-c", False, (0, 1, 2, 3), 30002)
    assert c.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree"}


def test_merge_keys_from_a_sibling_variable_of_group_vars(tmp_path: Path) -> None:
    # Defaults in a variable of their own beside ct200_site, merged into an anchored server that
    # the others merge in turn: merges nest.
    text = "ct200_server_defaults: &srv {engine: sglang, model: qwen, env: {NCCL_PROTO: LL}}\n"
    text += MERGED.replace(
        "    - &tp4\n      name: qwen-a\n      engine: sglang\n      model: qwen\n",
        "    - &tp4\n      <<: *srv\n      name: qwen-a\n",
    )
    write(tmp_path / "group_vars" / "all.yml", text)
    spec = load_spec(tmp_path)
    assert [(s.name, s.engine, s.model) for s in spec.servers] == [
        ("qwen-a", "sglang", "qwen"),
        ("qwen-b", "sglang", "qwen"),
        ("qwen-c", "sglang", "qwen"),
    ]
    assert spec.servers[0].env["NCCL_ALGO"] == "Ring"  # the explicit env replaces the merged one


def test_duplicate_key_beside_a_merge_key_is_still_an_error(tmp_path: Path) -> None:
    text = MERGED.replace("      name: qwen-b\n", "      name: qwen-b\n      port: 30005\n")
    message = refused(write(tmp_path / "site.yml", text))
    assert "duplicate key 'port'" in message
    assert "line 17" in message


# --- bounded input -----------------------------------------------------------------------------


def alias_bomb(levels: int = 9, width: int = 10) -> str:
    """width**levels strings once expanded, under a real key (models), in a few hundred bytes."""
    rows = [f"    - &l0 [{', '.join(['lol'] * width)}]"]
    rows += [f"    - &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "ct200_site:\n  gpus: {count: 1, model: x}\n  models:\n" + "\n".join(rows) + "\n"


def test_alias_bomb_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*_: object) -> object:
        raise AssertionError("the document was built")

    monkeypatch.setattr(spec_files.SpecLoader, "construct_document", never)
    message = refused(write(tmp_path / "site.yml", alias_bomb()))
    assert f"more than {MAX_NODES} YAML values once aliases are expanded" in message
    assert "alias bomb" in message


def test_alias_just_under_the_bound_loads(tmp_path: Path) -> None:
    # 3 levels of 10: about 1,100 nodes, far under the bound; the strings are no models, so the
    # schema refuses them, each with its path: the aliases were expanded, not refused.
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path / "site.yml", alias_bomb(levels=3)))
    issue_at(caught.value.issues, "models[2]", "mapping", "error")


def expanded(text: str, limit: int = MAX_NODES) -> int | None:
    node = yaml.compose(text, Loader=spec_files.SpecLoader)
    assert node is not None
    return spec_files.expanded_nodes(node, limit)


def test_expanded_nodes_counts_every_alias_as_its_whole_tree() -> None:
    # root, key a, [1, 2] (3), key b, [*x, *x] (1 + 2 * 3) = 13
    text = "a: &x [1, 2]\nb: [*x, *x]\n"
    assert expanded(text) == 13
    assert expanded(text, limit=12) is None
    assert expanded("a: &x [*x]\n") is None  # an alias inside itself never ends


def test_self_referencing_merge_is_an_error_not_a_hang(tmp_path: Path) -> None:
    assert "an alias that contains itself" in refused(
        write(tmp_path / "site.yml", "ct200_site: &a {<<: *a, gpus: 1}\n")
    )


def test_a_50_mb_spec_is_refused_after_reading_only_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "site.yml"
    with big.open("w") as fh:
        fh.write("ct200_site:\n  gpus: {count: 1, model: x}\n")
        fh.write(f"  # {'x' * 1020}\n" * (50 << 10))
    assert big.stat().st_size > 50 << 20
    before = bytes_read()
    message = refused(big)
    assert bytes_read() - before < 2 * MAX_BYTES  # the limit, and nothing like 50 MB
    assert f"larger than {MAX_BYTES >> 10} KiB" in message


def test_dev_zero_is_refused_after_reading_only_the_limit() -> None:
    before = bytes_read()
    message = refused("/dev/zero")
    assert bytes_read() - before < 2 * MAX_BYTES
    assert "a device, not a regular file" in message  # refused unread (untrusted.read_bounded)


def test_an_oversized_group_vars_file_with_the_spec_is_named(tmp_path: Path) -> None:
    big = EXAMPLE_FILE.read_text() + "# " + "y" * MAX_BYTES + "\n"
    write(tmp_path / "group_vars" / "all" / "ct200_site.yml", big)
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path)
    assert caught.value.source.endswith("ct200_site.yml")
    assert f"larger than {MAX_BYTES >> 10} KiB" in caught.value.issues[0].message


def test_an_unrelated_large_group_vars_file_is_skipped(tmp_path: Path) -> None:
    write(tmp_path / "group_vars" / "all" / "ct200_site.yml", EXAMPLE_FILE.read_text())
    # The key's name straddles the scan's chunk boundary in the other file: still not ours.
    write(tmp_path / "group_vars" / "all" / "certs.yml", "ca: |\n" + "  x\n" * MAX_BYTES)
    assert load_spec(tmp_path).gpus.count == 8
    straddle = "x" * (MAX_BYTES - 5) + SPEC_KEY + ": 1\n" + "y" * MAX_BYTES
    assert spec_files.mentions(write(tmp_path / "other.yml", straddle), SPEC_KEY)
    assert not spec_files.mentions(tmp_path / "group_vars" / "all" / "certs.yml", SPEC_KEY)


@pytest.mark.parametrize("key", ["models", "servers"])
def test_more_than_the_most_entries_is_refused_unread(tmp_path: Path, key: str) -> None:
    many = [{"name": f"m{i}"} for i in range(MAX_ENTRIES + 1)]
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path / "site.yml", yaml.safe_dump({SPEC_KEY: changed({key: many})})))
    issue = issue_at(caught.value.issues, key, "more than the 256", "error")
    assert "257 entries" in issue.message
    assert not any(i.path.startswith(f"{key}[") for i in caught.value.issues)  # none read


def test_a_gpu_list_longer_than_any_machine_is_refused(tmp_path: Path) -> None:
    data = changed({"servers[0].gpus": list(range(1000))})
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path / "site.yml", yaml.safe_dump({SPEC_KEY: data})))
    issue_at(caught.value.issues, "servers[0].gpus", "at most 64", "error")


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("bomb", alias_bomb(), "alias"),
        ("big", "ct200_site:\n" + "# padding\n" * (MAX_BYTES // 10 + 1), "KiB"),
        ("dev-zero", None, "a device"),
    ],
)
def test_doctor_validate_refuses_unbounded_input_with_exit_2(
    tmp_path: Path, name: str, content: str | None, fragment: str
) -> None:
    path = "/dev/zero" if content is None else str(write(tmp_path / f"{name}.yml", content))
    r = doctor("validate", path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert fragment in r.stderr


# --- encodings: say what is wrong and where ------------------------------------------------------

LATIN1 = "ct200_site:\n  gpus: {count: 1, model: caf\u00e9}\n"


def test_latin1_spec_names_the_byte_its_line_and_the_conversion(tmp_path: Path) -> None:
    message = refused(write(tmp_path / "site.yml", LATIN1.encode("latin-1")))
    assert "not UTF-8" in message
    assert "byte 0xe9 at line 2, column 30" in message
    assert "Latin-1" in message
    assert "iconv -f LATIN1 -t UTF-8" in message
    assert "permissions" not in message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_spec_is_named_as_such(tmp_path: Path, encoding: str) -> None:
    message = refused(write(tmp_path / "site.yml", LATIN1.encode(encoding)))
    assert "is UTF-16" in message
    assert "iconv -f UTF-16 -t UTF-8" in message


def test_utf8_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    text = EXAMPLE_FILE.read_text()
    assert load_spec(write(tmp_path / "site.yml", text.encode("utf-8-sig"))).gpus.count == 8


def test_nul_byte_inside_utf8_is_a_yaml_error_with_its_line(tmp_path: Path) -> None:
    message = refused(write(tmp_path / "site.yml", "ct200_site:\n  gpus: {count: 1\x00}\n"))
    assert "line 2" in message


def test_control_character_escaped_in_yaml_is_refused_with_its_path(tmp_path: Path) -> None:
    # YAML takes no raw control characters, but a double-quoted "\n" escape is one.
    text = EXAMPLE_FILE.read_text().replace(
        "env: {NCCL_PROTO: LL, NCCL_ALGO: Ring}",
        'env: {NCCL_PROTO: "LL\\nX=1", NCCL_ALGO: Ring}',
        1,
    )
    assert '"LL\\nX=1"' in text
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path / "site.yml", text))
    issue_at(caught.value.issues, "servers[0].env.NCCL_PROTO", "control character", "error")


# --- one resolver for both CLIs -----------------------------------------------------------------


def test_find_spec_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = write(tmp_path / "site.yml", "x")
    monkeypatch.setattr(spec_files, "DEFAULT_SPEC_PATH", str(default))
    env = {"CT200_SPEC": "/from/env"}
    assert find_spec("/given", env) == SpecChoice("/given", "--spec")
    assert find_spec(None, env) == SpecChoice("/from/env", "CT200_SPEC")
    assert find_spec(None, {"CT200_SPEC": ""}) == SpecChoice(str(default), "default")
    assert find_spec(None, {}).describe() == f"{default} (the default)"
    assert find_spec(None, env).describe() == "/from/env (from $CT200_SPEC)"
    assert find_spec("/given", env).describe() == "/given"
    default.unlink()
    none = find_spec(None, {})
    assert none == SpecChoice(None, "none")
    assert none.describe() == (
        f"no site spec: no --spec, CT200_SPEC is not set, and {default} does not exist"
    )


def test_empty_path_is_refused_not_read_as_the_current_directory() -> None:
    assert "empty" in refused("")


def test_find_spec_keeps_a_given_path_that_does_not_exist(tmp_path: Path) -> None:
    # Only the default is optional: a typo in --spec or CT200_SPEC is an error, not "no spec".
    missing = str(tmp_path / "typo.yml")
    assert find_spec(None, {"CT200_SPEC": missing}).path == missing
    assert "no such file" in refused(missing)


no_default = pytest.mark.skipif(
    Path("/etc/ct200/site.yml").exists(), reason="this machine has /etc/ct200/site.yml"
)


def test_doctor_validate_reads_ct200_spec_and_says_so() -> None:
    r = doctor("validate", env={"CT200_SPEC": CT200})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{CT200} (from $CT200_SPEC): valid (8 GPUs")


@no_default
def test_doctor_validate_without_any_spec_is_a_usage_error() -> None:
    r = doctor("validate")
    assert r.returncode == 2
    assert "nothing to validate: no site spec: no --spec, CT200_SPEC is not set" in r.stderr


@no_default
def test_doctor_check_without_a_spec_says_so_once() -> None:
    r = doctor("check", "--facts", str(FACTS))
    assert "Traceback" not in r.stderr
    assert r.stderr.count("no site spec: no --spec, CT200_SPEC is not set") == 1, r.stderr
    assert "spec: none" in r.stdout


def test_doctor_check_uses_ct200_spec() -> None:
    r = doctor("check", "--facts", str(FACTS), env={"CT200_SPEC": CT200})
    assert f"spec: {CT200}" in r.stdout
    assert "no site spec" not in r.stderr


@pytest.mark.parametrize("cli", [doctor, stage])
def test_spec_given_twice_is_a_usage_error(cli: object) -> None:
    assert callable(cli)
    args = ("check", "--facts", str(FACTS)) if cli is doctor else ("status",)
    r = cli(*args, "--spec", CT200, "--spec", "/elsewhere")
    assert r.returncode == 2
    assert "given 2 times" in r.stderr
    assert "Traceback" not in r.stderr


@no_default
def test_stage_without_any_spec_names_all_three_places() -> None:
    r = stage("status")
    assert r.returncode == 2
    assert "no site spec: no --spec, CT200_SPEC is not set" in r.stderr
    assert "pass --spec PATH" in r.stderr


def test_stage_reads_ct200_spec_like_the_doctor(tmp_path: Path) -> None:
    r = stage("status", "--json", env={"CT200_SPEC": CT200})
    assert "no site spec" not in r.stderr
    assert '"name": "qwen3.6-27b"' in r.stdout


def test_stage_with_a_spec_that_does_not_exist_says_no_such_file(tmp_path: Path) -> None:
    r = stage("status", "--spec", str(tmp_path / "typo.yml"))
    assert r.returncode == 2
    assert "no such file" in r.stderr
