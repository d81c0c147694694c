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
