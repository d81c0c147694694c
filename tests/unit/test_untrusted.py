"""ct200_tools.untrusted.show: text from outside can never reach a terminal raw."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ct200_tools.untrusted import is_plain, show


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
