"""Text from outside (HTTP answers, report files, journal lines, host names), made safe to show.

Everything the tools read from a server, a file or another machine may carry terminal escape
sequences, carriage returns or newlines that would rewrite the line above it, forge a table row
("fleet: ok") or hide a failure. ``show`` is the one way such text reaches a terminal, a journal
line or a textfile label: control characters (C0, DEL, C1), the Unicode line and paragraph
separators and the bidirectional overrides become visible escapes, and so does the backslash
itself, so an escape can never be faked by text that merely looks like one. JSON output keeps the
exact value (json.dumps escapes what JSON must), so a machine reader loses nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from typing import Literal


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if code < 0x20 or code == 0x7F:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{code:02x}")
    if code < 0x100 and not ch.isprintable():
        return f"\\x{code:02x}"
    # isprintable() is False for every format character (the bidirectional overrides of Trojan
    # Source, CVE-2021-42574, zero-width characters), the line and paragraph separators that
    # some terminals and log viewers break lines at, and unassigned or private code points.
    if not ch.isprintable():
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return ch


def show(value: object, limit: int | None = None) -> str:
    """``value`` as one printable line: every control or invisible character escaped.

    Bytes are decoded as UTF-8 with undecodable bytes shown as ``\\xNN``. With ``limit``, the
    result is cut to about that many characters and says how much was left out, so a hostile
    megabyte cannot flood a terminal.
    """
    if isinstance(value, bytes | bytearray):
        # surrogateescape maps each undecodable byte to U+DC80..U+DCFF, shown as that byte.
        text = bytes(value).decode("utf-8", errors="surrogateescape")
        out = "".join(
            f"\\x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF else _escape_char(ch)
            for ch in text
        )
    else:
        out = "".join(_escape_char(ch) for ch in str(value))
    if limit is not None and len(out) > limit:
        return f"{out[:limit]}... ({len(out) - limit} more characters)"
    return out


def is_plain(value: str) -> bool:
    """True when ``show(value)`` would change nothing: safe to print as it is."""
    return show(value) == value


#: Why a file was refused, for callers whose fix depends on it (a missing serving.json is no
#: error at all; an unreadable one wants root, a damaged one a rewrite).
Problem = Literal["missing", "unreadable", "not-regular", "too-large", "format"]


class UntrustedInputError(ValueError):
    """A file from outside that cannot be used: the message names it, ``fix`` says what to do.

    Commands turn it into exit 2 (bad input) with the fix line, never exit 3 and never a hang.
    ``reason`` is the message without the file's name, for callers that name it their own way;
    ``problem`` says which kind of refusal it is.
    """

    def __init__(
        self, message: str, fix: str, *, problem: Problem = "format", reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.problem: Problem = problem
        self.reason = reason or message


def read_bounded(path: str | os.PathLike[str], what: str, max_bytes: int, fix: str) -> bytes:
    """The whole content of the regular file ``path``, at most ``max_bytes`` of it.

    ``what`` names the file for the message ("the fleet report", "serving.json"). A FIFO, a
    socket, a device (/dev/zero) or a directory is refused before any blocking read: the file
    is opened with O_NONBLOCK (a FIFO with no writer opens at once instead of hanging) and judged
    by fstat on the open descriptor, so a path swapped after the check cannot slip through.
    Symlinks are followed (a site may link its files), but the target must be a regular file.
    """
    shown = show(os.fspath(path))

    def refuse(reason: str, problem: Problem) -> UntrustedInputError:
        return UntrustedInputError(f"{what} {shown} {reason}", fix, problem=problem, reason=reason)

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise refuse("does not exist", "missing") from None
    except OSError as exc:
        # A socket cannot be opened at all (ENXIO): say what it is rather than the errno.
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise refuse(f"is {file_kind(mode)}, not a regular file", "not-regular") from None
        raise refuse(f"cannot be opened: {show(exc.strerror or exc)}", "unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(f"is {file_kind(st.st_mode)}, not a regular file", "not-regular")
        if st.st_size > max_bytes:
            raise refuse(f"is {st.st_size} bytes, more than the {max_bytes} it may be", "too-large")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                # The file grew while it was read (or lied about its size, as /proc files do).
                raise refuse(f"is more than the {max_bytes} bytes it may be", "too-large")
        return b"".join(chunks)
    except OSError as exc:
        raise refuse(f"cannot be read: {show(exc.strerror or exc)}", "unreadable") from None
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def load_json(
    path: str | os.PathLike[str], what: str, max_bytes: int, fix: str, max_depth: int = 32
) -> object:
    """``path`` read with ``read_bounded`` and parsed as UTF-8 JSON nested at most ``max_depth``.

    The caller validates the types (``Fields``).
    """
    data = read_bounded(path, what, max_bytes, fix)
    return parse_json(data, f"{what} {show(os.fspath(path))}", fix, max_depth)


def parse_json(data: bytes | str, what: str, fix: str, max_depth: int = 32) -> object:
    """``data`` parsed as JSON nested at most ``max_depth``; ``what`` names it in the messages.

    The depth is measured before parsing (json.loads recurses, and a deep document would raise
    RecursionError, which is no user's error message).
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"is not UTF-8 (byte {exc.start}): not JSON"
            raise UntrustedInputError(f"{what} {reason}", fix, reason=reason) from None
    else:
        text = data
    depth, where = _deepest(text, max_depth)
    if depth > max_depth:
        reason = f"is nested more than {max_depth} levels deep (at character {where})"
        raise UntrustedInputError(f"{what} {reason}", fix, reason=reason)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = f"is not JSON: {show(exc, 200)}"
        raise UntrustedInputError(f"{what} {reason}", fix, reason=reason) from None


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, brackets inside strings not counted."""
    return _deepest(text, None)[0]


def _deepest(text: str, stop_above: int | None) -> tuple[int, int]:
    """(The deepest nesting, the offset where it was reached); the scan stops at the first
    bracket deeper than ``stop_above``, so a hostile document is not walked to its end."""
    depth = deepest = where = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest, where = depth, i
                if stop_above is not None and depth > stop_above:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest, where


# --- typed fields -------------------------------------------------------------------------------


class FieldError(ValueError):
    """A field of a parsed document that is missing or of the wrong type; ``path`` names it the
    way a person finds it in the file (``hosts[3].checks[0].detail``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def kind_of(value: object) -> str:
    """What a JSON value is, in words: for "expected a string, got a list"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'}"
    if isinstance(value, int | float):
        return f"the number {show(value, 40)}"
    if isinstance(value, str):
        return f'the string "{show(value, 40)}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def wrong(path: str, expected: str, value: object) -> FieldError:
    return FieldError(path, f"expected {expected}, got {kind_of(value)}")


def each(value: object, path: str) -> Iterator[tuple[str, object]]:
    """The items of the list ``value`` with their paths (``hosts[0]``, ``hosts[1]``...)."""
    if not isinstance(value, list):
        raise wrong(path, "a list", value)
    for i, item in enumerate(value):
        yield f"{path}[{i}]", item


_MISSING = object()


class Fields:
    """A JSON object from outside, read field by field: each accessor returns the field typed as
    asked or raises FieldError naming its path. ``bool`` is never taken for a number."""

    def __init__(self, value: object, path: str = "") -> None:
        if not isinstance(value, dict):
            raise wrong(path, "an object", value)
        self.value: dict[str, object] = value
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, optional: bool) -> object:
        got = self.value.get(key, _MISSING)
        if got is _MISSING:
            if optional:
                return None
            raise FieldError(self.at(key), "missing")
        return got

    def raw(self, key: str) -> object:
        return self._get(key, True)

    def text(self, key: str) -> str:
        got = self._get(key, False)
        if not isinstance(got, str):
            raise wrong(self.at(key), "a string", got)
        return got

    def opt_text(self, key: str) -> str | None:
        """A string, or None when absent or null."""
        got = self._get(key, True)
        if got is not None and not isinstance(got, str):
            raise wrong(self.at(key), "a string or null", got)
        return got

    def opt_int(self, key: str) -> int | None:
        got = self._get(key, True)
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            raise wrong(self.at(key), "an integer or null", got)
        return got

    def texts(self, key: str, optional: bool = False) -> list[str]:
        """A list of strings (absent or null: empty, when ``optional``)."""
        got = self._get(key, optional)
        if got is None and optional:
            return []
        out = []
        for where, item in each(got, self.at(key)):
            if not isinstance(item, str):
                raise wrong(where, "a string", item)
            out.append(item)
        return out

    def obj(self, key: str) -> Fields:
        return Fields(self._get(key, False), self.at(key))

    def opt_obj(self, key: str) -> Fields | None:
        got = self._get(key, True)
        return None if got is None else Fields(got, self.at(key))

    def each(self, key: str) -> Iterator[tuple[str, object]]:
        return each(self._get(key, False), self.at(key))
