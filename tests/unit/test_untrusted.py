"""ct200_tools.untrusted: text from outside never reaches a terminal raw; files from outside are
read only when regular, bounded and shallow."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.untrusted import (
    FieldError,
    Fields,
    UntrustedInputError,
    each,
    is_plain,
    json_depth,
    load_json,
    parse_json,
    read_bounded,
    show,
)


def test_controls_and_escapes_are_visible() -> None:
    assert show("ok\r\nfleet: ok") == "ok\\r\\nfleet: ok"
    assert show("\x1b[2J\x07\x7f\x9b") == "\\x1b[2J\\x07\\x7f\\x9b"
    assert show("a\u202eb\u2028") == "a\\u202eb\\u2028"


def test_backslash_is_escaped_so_an_escape_cannot_be_faked() -> None:
    assert show("\\x1b") == "\\\\x1b"
    assert show("\\x1b") != show("\x1b")


def test_bytes_that_are_not_utf8_are_shown_as_bytes() -> None:
    assert show(b"a\xff\\") == "a\\xff\\\\"
    assert show("é".encode()) == "é"


def test_limit_says_how_much_was_left_out() -> None:
    assert show("x" * 50, limit=10) == "x" * 10 + "... (40 more characters)"


def test_plain_text_is_unchanged() -> None:
    assert is_plain("qwen-tp4-ddtree: answered 200")
    assert not is_plain("a\nb")


@given(st.text() | st.binary())
def test_the_result_is_one_printable_line(value: str | bytes) -> None:
    out = show(value)
    assert all(ch.isprintable() for ch in out)
    assert "\n" not in out and "\r" not in out


FIX = "pass the file ct200-doctor fleet wrote"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UntrustedInputError, match="a FIFO"):
        read_bounded(fifo, "the fleet report", 1024, FIX)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a device"), ("/dev/null", "a device"), ("/", "a directory")]
)
def test_devices_and_directories_are_refused(path: str, kind: str) -> None:
    with pytest.raises(UntrustedInputError, match=kind) as info:
        read_bounded(path, "the fleet report", 1024, FIX)
    assert info.value.fix == FIX


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(UntrustedInputError, match="a socket"):
            read_bounded(path, "serving.json", 1024, FIX)


def test_a_link_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "serving.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(UntrustedInputError, match="a device"):
        read_bounded(link, "serving.json", 1024, FIX)


def test_size_is_bounded_and_named(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(UntrustedInputError, match="2048 bytes, more than the 1024"):
        read_bounded(big, "the fleet report", 1024, FIX)
    assert read_bounded(big, "the fleet report", 2048, FIX) == b"x" * 2048


def test_missing_and_unreadable_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(UntrustedInputError, match="does not exist"):
        read_bounded(tmp_path / "nope\x1b", "the fleet report", 1024, FIX)
    with pytest.raises(UntrustedInputError, match=r"nope\\x1b"):
        read_bounded(tmp_path / "nope\x1b", "the fleet report", 1024, FIX)


def test_deep_json_is_refused_before_parsing(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UntrustedInputError, match="nested more than 32"):
        load_json(deep, "the fleet report", 1 << 20, FIX)


def test_brackets_in_strings_do_not_count() -> None:
    assert json_depth('{"a": "[[[[\\"[[["}') == 1


def test_json_that_is_not_json_or_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff{}")
    with pytest.raises(UntrustedInputError, match="not UTF-8"):
        load_json(bad, "the fleet report", 1024, FIX)
    bad.write_text("{nope")
    with pytest.raises(UntrustedInputError, match="not JSON"):
        load_json(bad, "the fleet report", 1024, FIX)
    bad.write_text('{"hosts": []}')
    assert load_json(bad, "the fleet report", 1024, FIX) == {"hosts": []}


# -- which refusal, and typed fields with their paths ------------------------------------------


def test_the_refusal_says_which_kind_it_is(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (tmp_path / "nope", "missing"),
        (fifo, "not-regular"),
        (Path("/dev/zero"), "not-regular"),
    ]
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    cases.append((big, "too-large"))
    for path, problem in cases:
        with pytest.raises(UntrustedInputError) as info:
            read_bounded(path, "the fleet report", 1024, FIX)
        assert info.value.problem == problem
        assert info.value.message == f"the fleet report {path} {info.value.reason}"


def test_parse_json_says_where_the_nesting_is_too_deep() -> None:
    text = '{"a": ' + "[" * 40 + "]" * 40 + "}"
    with pytest.raises(UntrustedInputError, match=r"more than 32 levels deep \(at character 37\)"):
        parse_json(text, "the fleet report x", FIX)
    assert parse_json(b'{"a": [1]}', "x", FIX) == {"a": [1]}


def test_fields_name_the_path_and_what_was_found() -> None:
    doc = {"hosts": [{"host": "a", "rc": 0}, {"host": ["b"], "rc": True, "stderr": ["x", 3]}]}
    rows = list(Fields(doc).each("hosts"))
    first = Fields(rows[0][1], rows[0][0])
    assert first.text("host") == "a" and first.opt_int("rc") == 0 and first.opt_text("x") is None
    assert first.texts("stderr", optional=True) == []
    second = Fields(rows[1][1], rows[1][0])
    with pytest.raises(FieldError, match=r"^hosts\[1\]\.host: expected a string, got a list$"):
        second.text("host")
    with pytest.raises(
        FieldError, match=r"^hosts\[1\]\.rc: expected an integer or null, got true$"
    ):
        second.opt_int("rc")
    with pytest.raises(FieldError, match=r"^hosts\[1\]\.stderr\[1\]: expected a string, got the"):
        second.texts("stderr")
    with pytest.raises(FieldError, match=r"^hosts\[1\]\.detail: missing$"):
        second.text("detail")
    with pytest.raises(FieldError, match=r"^hosts: expected a list, got an object$"):
        list(each({}, "hosts"))
    with pytest.raises(FieldError, match=r'^x: expected an object, got the string "\\x1b\[2J"$'):
        Fields("\x1b[2J", "x")
