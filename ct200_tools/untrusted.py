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


class UntrustedInputError(ValueError):
    """A file from outside that cannot be used: the message names it, ``fix`` says what to do.

    Commands turn it into exit 2 (bad input) with the fix line, never exit 3 and never a hang.
    """

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def read_bounded(path: str | os.PathLike[str], what: str, max_bytes: int, fix: str) -> bytes:
    """The whole content of the regular file ``path``, at most ``max_bytes`` of it.

    ``what`` names the file for the message ("the fleet report", "serving.json"). A FIFO, a
    socket, a device (/dev/zero) or a directory is refused before any blocking read: the file
    is opened with O_NONBLOCK (a FIFO with no writer opens at once instead of hanging) and judged
    by fstat on the open descriptor, so a path swapped after the check cannot slip through.
    Symlinks are followed (a site may link its files), but the target must be a regular file.
    """
    shown = show(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UntrustedInputError(f"{what} {shown} does not exist", fix) from None
    except OSError as exc:
        # A socket cannot be opened at all (ENXIO): say what it is rather than the errno.
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise UntrustedInputError(
                    f"{what} {shown} is {_kind(mode)}, not a regular file", fix
                ) from None
        raise UntrustedInputError(
            f"{what} {shown} cannot be opened: {show(exc.strerror or exc)}", fix
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedInputError(
                f"{what} {shown} is {_kind(st.st_mode)}, not a regular file", fix
            )
        if st.st_size > max_bytes:
            raise UntrustedInputError(
                f"{what} {shown} is {st.st_size} bytes, more than the {max_bytes} it may be",
                fix,
            )
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
                raise UntrustedInputError(
                    f"{what} {shown} is more than the {max_bytes} bytes it may be", fix
                )
        return b"".join(chunks)
    except OSError as exc:
        raise UntrustedInputError(
            f"{what} {shown} cannot be read: {show(exc.strerror or exc)}", fix
        ) from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
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

    The depth is measured before parsing (json.loads recurses, and a deep document would raise
    RecursionError, which is no user's error message). The caller validates the types.
    """
    data = read_bounded(path, what, max_bytes, fix)
    shown = show(os.fspath(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedInputError(
            f"{what} {shown} is not UTF-8 (byte {exc.start}): not JSON", fix
        ) from None
    if json_depth(text) > max_depth:
        raise UntrustedInputError(
            f"{what} {shown} is nested more than {max_depth} levels deep", fix
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UntrustedInputError(f"{what} {shown} is not JSON: {show(exc, 200)}", fix) from None


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
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
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
