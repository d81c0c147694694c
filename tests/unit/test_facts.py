"""Facts documents: every recorded fixture round-trips; malformed documents raise
FactsFormatError naming what is wrong; unknown fields are ignored; fuzzing never escapes
FactsFormatError."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ct200_tools.facts as facts_module
from ct200_tools.facts import (
    MAX_FACTS_BYTES,
    MAX_INT_DIGITS,
    SCHEMA_VERSION,
    SECTIONS,
    DevNode,
    Facts,
    FactsFormatError,
    dumps,
    loads,
    read_file,
    to_jsonable,
)
from ct200_tools.untrusted import UntrustedInputError

FACTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "facts"
FIXTURES = sorted(FACTS_DIR.glob("*.json"))
#: Written by `ct200-doctor snapshot` on real machines (the others are derived by hand/scripts).
RECORDED = ("h200-healthy", "h200-uvm-denied", "h200-uvm-stale", "h200-c195-denied", "nodriver-vm")


def healthy_data() -> dict[str, Any]:
    data = json.loads((FACTS_DIR / "h200-healthy.json").read_text())
    assert isinstance(data, dict)
    return data


def bad(data: Any) -> str:
    """The FactsFormatError message for a document."""
    with pytest.raises(FactsFormatError) as info:
        loads(json.dumps(data))
    return str(info.value)


# -- round trips -------------------------------------------------------------------------------
def test_fixtures_present() -> None:
    names = {p.stem for p in FIXTURES}
    assert set(RECORDED) <= names


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_round_trips(path: Path) -> None:
    text = path.read_text()
    facts = loads(text)
    assert loads(dumps(facts)) == facts
    assert facts.schema_version == SCHEMA_VERSION
    # Nothing in the document is lost on the way in: re-serialising gives the same data.
    assert json.loads(dumps(facts)) == json.loads(text)


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_fixture_is_byte_stable(name: str) -> None:
    """Snapshots written by the doctor are exactly what dumps() writes again."""
    text = (FACTS_DIR / f"{name}.json").read_text()
    assert dumps(loads(text)) == text


def test_loaded_types_are_the_dataclasses() -> None:
    facts = loads((FACTS_DIR / "h200-healthy.json").read_text())
    assert facts.nvml is not None and facts.devices is not None and facts.pci is not None
    assert isinstance(facts.pci, tuple) and isinstance(facts.nvml.gpus, tuple)
    assert isinstance(facts.nvml.gpus[0].cpu_affinity, tuple)
    assert facts.nvml.gpus[0].remapped_rows is not None
    assert facts.nvml.gpus[0].remapped_rows.pending is False
    assert isinstance(facts.devices.majors, dict) and facts.devices.majors["nvidia-uvm"] == 238
    assert facts.devices.node("/dev/nvidia-uvm") == DevNode(
        "/dev/nvidia-uvm", True, True, 238, 0, 0o666, 0
    )
    assert facts.devices.node("/dev/nope") is None
    assert facts.cuda is not None and isinstance(facts.cuda.duration_s, float)


def test_why_unreadable() -> None:
    healthy = loads((FACTS_DIR / "h200-healthy.json").read_text())
    assert healthy.why_unreadable("pci") == (
        "pci.0000:00:06.0.numa_node: sysfs numa_node is -1: the platform reports no NUMA node"
    )
    assert healthy.why_unreadable("pc") is None  # a prefix ends at a dot
    assert (
        healthy.why_unreadable("memory", "nvml.gpu0")
        == "nvml.gpu0.retired_pages_pending: Not Supported"
    )
    nodriver = loads((FACTS_DIR / "nodriver-vm.json").read_text())
    assert nodriver.why_unreadable("nvml") == "nvml: nvmlInit failed: NVML Shared Library Not Found"


# -- malformed documents ----------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_wrong_schema_version(version: Any) -> None:
    data = healthy_data()
    data["schema_version"] = version
    msg = bad(data)
    assert f"schema_version {version!r}" in msg
    assert f"this doctor reads {SCHEMA_VERSION}" in msg
    assert "take the snapshot again" in msg


def test_schema_version_true_is_not_1() -> None:
    """True == 1 in Python; the version check lets it through, the type check must not."""
    data = healthy_data()
    data["schema_version"] = True
    assert bad(data) == "facts.schema_version: expected int, got bool"


@pytest.mark.parametrize("text", ["", "{", "not json", "{'schema_version': 1}", "[1,]"])
def test_not_json(text: str) -> None:
    with pytest.raises(FactsFormatError, match=r"^not JSON \("):
        loads(text)


@pytest.mark.parametrize("data", [{}, [], 1, "facts", None, {"hostname": "vm"}, [{"a": 1}]])
def test_no_schema_version(data: Any) -> None:
    assert bad(data) == "not a ct200-doctor facts document (no schema_version)"


@pytest.mark.parametrize(
    ("edit", "where", "what"),
    [
        (lambda d: d["nvml"].update(gpus=5), "facts.nvml.gpus", "expected a list"),
        (lambda d: d.update(pci=5), "facts.pci", "expected a list"),
        (lambda d: d.update(kernel=[]), "facts.kernel", "expected an object, got list"),
        (
            lambda d: d["kernel"].update(numa_balancing="0"),
            "facts.kernel.numa_balancing",
            "expected int, got str",
        ),
        (
            lambda d: d["nvml"]["gpus"][0].update(persistence_mode=1),
            "facts.nvml.gpus[0].persistence_mode",
            "expected bool, got int",
        ),
        (
            lambda d: d["nvml"]["gpus"][0]["cpu_affinity"].append(1.5),
            "facts.nvml.gpus[0].cpu_affinity[16]",
            "expected int, got float",
        ),
        (
            lambda d: d["devices"]["majors"].update(nvidia="195"),
            "facts.devices.majors.nvidia",
            "expected int, got str",
        ),
        (lambda d: d.update(unreadable=[]), "facts.unreadable", "expected an object"),
        (lambda d: d["unreadable"].update(x=None), "facts.unreadable.x", "expected str"),
        (lambda d: d["cuda"].update(duration_s="0.3"), "facts.cuda.duration_s", "a number"),
        (lambda d: d["cuda"].update(duration_s=True), "facts.cuda.duration_s", "a number"),
        (
            lambda d: d["probes"][0].pop("duration_s"),
            "facts.probes[0]",
            "duration_s",  # the missing required field is named
        ),
        (lambda d: d["nvml"]["gpus"][0].pop("uuid"), "facts.nvml.gpus[0]", "uuid"),
    ],
)
def test_wrong_field_type(edit: Any, where: str, what: str) -> None:
    data = healthy_data()
    edit(data)
    msg = bad(data)
    assert msg.startswith(where + ":") or msg.startswith(where + " "), msg
    assert what in msg


def test_int_is_accepted_for_float() -> None:
    """JSON writers may print 0.0 as 0: a duration is still a float after loading."""
    data = healthy_data()
    data["cuda"]["duration_s"] = 1
    facts = loads(json.dumps(data))
    assert facts.cuda is not None and facts.cuda.duration_s == 1.0
    assert isinstance(facts.cuda.duration_s, float)


def test_unknown_fields_are_ignored() -> None:
    """A newer doctor's snapshot (extra fields, same schema version) still loads."""
    data = healthy_data()
    data["gpu_clocks"] = {"sm": 1980}
    data["kernel"]["lockdown"] = "none"
    data["nvml"]["gpus"][0]["fabric"] = {"state": "N/A"}
    data["nvml"]["extra"] = [1, 2, 3]
    data["devices"]["nodes"][0]["selinux_label"] = "x"
    data["probes"][0]["attempts"] = 1
    assert loads(json.dumps(data)) == loads(json.dumps(healthy_data()))


def test_sections_default_only_with_a_reason() -> None:
    """Issue 9: a section the probes fill may be null (or absent) only where `unreadable` says
    why; a bare null made every check of it skip and the run look clean."""
    with pytest.raises(FactsFormatError, match=r"^facts.kernel is missing and facts.unreadable"):
        loads(json.dumps({"schema_version": SCHEMA_VERSION}))
    why = dict.fromkeys(SECTIONS, "probe did not finish within 10 s")
    facts = loads(json.dumps({"schema_version": SCHEMA_VERSION, "unreadable": why}))
    assert facts == Facts(unreadable=why)
    assert facts.nvml is None and facts.probes == ()


@pytest.mark.parametrize(
    "section", ["nvml", "cuda", "devices", "memory", "kernel", "pci", "models"]
)
def test_null_section_without_a_reason_is_a_format_error(section: str) -> None:
    data = healthy_data()
    data[section] = None
    assert bad(data) == (
        f"facts.{section} is null and facts.unreadable.{section} does not say why: a snapshot "
        "records why a probe could not read a section; take it again with `ct200-doctor snapshot`"
    )
    data["unreadable"][f"{section}.something"] = "a part of it"  # a part explains no null
    assert "does not say why" in bad(data)
    data["unreadable"][section] = "probe failed: OSError"
    assert getattr(loads(json.dumps(data)), section) is None


# -- files: size, encodings, numbers ----------------------------------------------------------
def _file(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "facts.json"
    p.write_bytes(data)
    return p


def read_error(path: Path | str) -> str:
    with pytest.raises(FactsFormatError) as info:
        read_file(path)
    return str(info.value)


def test_latin1_file_names_the_byte_and_line(tmp_path: Path) -> None:
    text = (FACTS_DIR / "h200-healthy.json").read_text().replace('"vm"', '"caf\u00e9"', 1)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "caf" in t)
    msg = read_error(_file(tmp_path, text.encode("latin-1")))
    assert msg.startswith(f"not UTF-8: byte 0xe9 at line {line}, column ")
    assert "Latin-1" in msg and "iconv -f LATIN1 -t UTF-8" in msg


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_name_the_encoding(tmp_path: Path, codec: str) -> None:
    msg = read_error(_file(tmp_path, (FACTS_DIR / "h200-healthy.json").read_text().encode(codec)))
    if codec == "utf-16-be":  # no byte-order mark: the NUL bytes tell
        assert msg.startswith("a NUL byte at line 1, column 1 (UTF-16 or UTF-32 without a")
    else:
        assert msg.startswith(f"encoded as {codec.upper()}")  # UTF-16LE, UTF-32LE
        assert "iconv -f" in msg


def test_utf8_byte_order_mark_is_fine(tmp_path: Path) -> None:
    text = (FACTS_DIR / "h200-healthy.json").read_text()
    assert read_file(_file(tmp_path, b"\xef\xbb\xbf" + text.encode())) == loads(text)


def test_huge_integer_names_its_line(tmp_path: Path) -> None:
    data = healthy_data()
    data["memory"]["shm_size"] = 7
    text = json.dumps(data, indent=2).replace('"shm_size": 7', '"shm_size": ' + "9" * 5000)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "shm_size" in t)
    msg = read_error(_file(tmp_path, text.encode()))
    assert msg == (
        f"an integer of 5000 digits at line {line}, column 17: no fact has more than "
        f"{MAX_INT_DIGITS}"
    )


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused(number: str) -> None:
    text = json.dumps(healthy_data()).replace(
        '"duration_s": 0.', f'"duration_s": {number}, "x": 0.', 1
    )
    with pytest.raises(FactsFormatError, match=rf"^{re.escape(number)} at line 1, column \d+: "):
        loads(text)


def test_size_is_bounded(tmp_path: Path) -> None:
    # A device is refused unread (untrusted.read_bounded), a regular file by its size.
    with pytest.raises(UntrustedInputError, match="a device, not a regular file"):
        read_file("/dev/zero")
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(MAX_FACTS_BYTES + 1)
    assert read_error(big).startswith("larger than 64 MiB")


def test_deeply_nested_document() -> None:
    with pytest.raises(FactsFormatError):
        loads('{"schema_version": 1, "kernel": ' + "[" * 100_000 + "]" * 100_000 + "}")


# -- fuzzing ----------------------------------------------------------------------------------
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELD_NAMES = sorted(
    {
        f.name
        for cls in vars(facts_module).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls)
        for f in dataclasses.fields(cls)
    }
)


def _loads_or_format_error(text: str) -> Facts | None:
    try:
        return loads(text)
    except FactsFormatError:
        return None


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_loads_arbitrary_json_raises_only_format_error(data: Any) -> None:
    _loads_or_format_error(json.dumps(data))


# Documents that get past the version check, with the doctor's own keys at every level so the
# type checks are exercised rather than skipped.
DOC_JSON = st.recursive(
    JSON,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=5), inner, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELD_NAMES), DOC_JSON, max_size=8))
def test_loads_versioned_garbage_raises_only_format_error(body: dict[str, Any]) -> None:
    body["schema_version"] = SCHEMA_VERSION
    _loads_or_format_error(json.dumps(body))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_loads_mutated_fixture_raises_only_format_error(data: st.DataObject) -> None:
    """Replace one value anywhere in the healthy fixture with arbitrary JSON."""
    doc = healthy_data()
    paths: list[list[Any]] = []

    def walk(node: Any, path: list[Any]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*path, i])

    walk(doc, [])
    path = data.draw(st.sampled_from(paths[1:]))
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = data.draw(JSON)
    _loads_or_format_error(json.dumps(doc))


# Typed strategies straight from the dataclasses, so a new field is fuzzed without a change here.
def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(inner) == 1
        return st.none() | strategy_for(inner[0])
    if dataclasses.is_dataclass(tp):
        return facts_of(tp)
    if origin is tuple:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3).map(tuple)
    if origin is dict:
        _, vt = typing.get_args(tp)
        return st.dictionaries(st.text(max_size=8), strategy_for(vt), max_size=3)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)  # NaN != NaN breaks equality
    if tp is int:  # what a probe can read; loads refuses longer numbers (issue 9)
        return st.integers(min_value=-(10**MAX_INT_DIGITS) + 1, max_value=10**MAX_INT_DIGITS - 1)
    if tp in (str, bool):
        return st.from_type(tp)
    raise AssertionError(f"no strategy for {tp!r}")


def facts_of(cls: Any, **fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls,
        **{f.name: fixed.get(f.name, strategy_for(hints[f.name])) for f in dataclasses.fields(cls)},
    )


def explain_nulls(facts: Facts) -> Facts:
    """What a probe does for a section it could not read: say why (loads requires it)."""
    why = {s: "not read" for s in SECTIONS if getattr(facts, s) is None}
    return dataclasses.replace(facts, unreadable={**facts.unreadable, **why})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts_of(Facts, schema_version=st.just(SCHEMA_VERSION)).map(explain_nulls))
def test_generated_facts_round_trip(facts: Facts) -> None:
    assert loads(dumps(facts)) == facts
    assert to_jsonable(loads(dumps(facts))) == to_jsonable(facts)
