"""The one HTTP client: readiness polls, the smoke test and the doctor's server probes.

A server's port is outside our control: whatever answers there may trickle its head a byte a
second, cut it off, announce a body it never sends, redirect elsewhere or put escape sequences
in its reason phrase. So this client, on a plain socket (HTTP/1.1, no TLS, no keep-alive):

- has one deadline for the WHOLE request (connect, send, head and body): each read waits only
  for what is left of it, so a trickle cannot stretch it (a socket timeout bounds one read);
- requires a complete answer: a head cut off by EOF or the deadline is an error (http.client
  takes EOF inside the head for its end and would report the status), and so is a body shorter
  than its Content-Length or a chunked body without its last chunk;
- bounds the head and the body in bytes;
- follows no redirect and asks no proxy: the answer is the port's own, or none;
- parses JSON bounded in depth, and `count` reads a number only when it is one (a JSON `true`
  is a bool, which Python counts as an int).

Errors are `HttpError` (an OSError, so callers that treat "no answer" as OSError keep doing so)
with a message that names what happened; anything the server said in it is escaped.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ct200_tools.untrusted import json_depth, show

#: A head (status line and header fields) is a few hundred bytes; 64 KiB is http.client's line.
MAX_HEAD: Final = 64 * 1024
MAX_HEADERS: Final = 100
#: The most of a body that is read: /v1/models and a 1-token completion are small.
MAX_BODY: Final = 1 << 20
#: Interim 1xx heads skipped before the real one (a server may send 100 Continue unasked).
MAX_INTERIM: Final = 4
#: JSON answers nest a few levels; json.loads recurses, so depth is bounded before parsing.
MAX_JSON_DEPTH: Final = 32
#: A count (tokens, ...) above this is no count a server could mean.
MAX_COUNT: Final = 2**31 - 1

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2})(?: (.*))?")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LENGTH = re.compile(r"[0-9]{1,19}")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;.*)?")


class HttpError(OSError):
    """No complete answer: refused, cut off, too large, not HTTP. The message says which."""


class HttpTimeout(HttpError, TimeoutError):
    """The whole request did not complete within its deadline."""


@dataclass(frozen=True)
class Answer:
    """A complete answer. `reason`, header values and `body` are exactly what the server sent
    (decoded as UTF-8, undecodable bytes replaced); show them through `untrusted.show`."""

    status: int
    reason: str
    #: Header fields by lower-case name; repeated fields joined with ", ".
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def redirect(self) -> bool:
        return 300 <= self.status < 400

    @property
    def location(self) -> str | None:
        return self.headers.get("location")

    def summary(self, what: str = "an answer") -> str:
        """The status for people, escaped: "503 Service Unavailable"; a redirect also says
        where to and that it was not followed (`redirect_note`)."""
        head = f"{self.status} {show(self.reason, 80)}".rstrip()
        return f"{head}, {self.redirect_note(what)}" if self.redirect else head

    def redirect_note(self, what: str = "an answer") -> str:
        """ "a redirect to <Location, escaped> (not followed: <what> must come from the server's
        own port)"."""
        where = show(self.location, 200) if self.location is not None else "nowhere (no Location)"
        return f"a redirect to {where} (not followed: {what} must come from the server's own port)"


def request(
    method: str,
    url: str,
    body: bytes | None = None,
    *,
    timeout_s: float,
    max_body: int = MAX_BODY,
    content_type: str = "application/json",
) -> Answer:
    """`method url` with `body`, one complete answer within `timeout_s` seconds in all.

    Raises HttpTimeout past the deadline and HttpError for every other way there is no complete
    answer. A 3xx is an answer (see Answer.redirect): it is returned, never followed.
    """
    deadline = time.monotonic() + timeout_s
    host, port, target, authority = _split(url)
    head = [
        f"{method} {target} HTTP/1.1",
        f"Host: {authority}",
        "User-Agent: ct200-tools",
        "Accept: application/json",
        "Connection: close",
    ]
    if body is not None:
        head += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")
    with _Conn(host, port, deadline, timeout_s) as conn:
        conn.send(data)
        for _ in range(MAX_INTERIM + 1):
            status, reason, headers = _parse_head(conn.read_head())
            if not 100 <= status < 200:
                break
        else:
            raise HttpError(f"more than {MAX_INTERIM} interim (1xx) answers and no final one")
        no_body = method == "HEAD" or status in (204, 304)
        payload = b"" if no_body else _read_body(conn, headers, max_body)
    return Answer(status, reason, headers, payload)


def _secs(t: float) -> str:
    return f"{round(t, 2):g}"


def _split(url: str) -> tuple[str, int, str, str]:
    """(host, port, request target, Host header) of an http:// URL; HttpError otherwise."""
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise HttpError(f"{show(url)} is not a URL this client asks (spaces or control chars)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port if parts.port is not None else 80
    except ValueError:
        raise HttpError(f"{show(url)} is not a URL with a valid host and port") from None
    if parts.scheme != "http" or not parts.hostname or port == 0:
        raise HttpError(f"{show(url)} is not an http:// URL with a host")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, target, parts.netloc.rpartition("@")[2]


class _Conn:
    """A socket whose every wait ends at the request's deadline."""

    def __init__(self, host: str, port: int, deadline: float, timeout_s: float) -> None:
        self.deadline, self.timeout_s = deadline, timeout_s
        self.buf = bytearray()
        self.sock = self._connect(host, port)

    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _left(self, doing: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HttpTimeout(f"no complete answer within {_secs(self.timeout_s)} s ({doing})")
        return left

    def _connect(self, host: str, port: int) -> socket.socket:
        # getaddrinfo has no timeout; hosts here are addresses or names from /etc/hosts.
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:  # UnicodeError: a label IDNA cannot encode
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise HttpError(f"cannot resolve {show(host)}: {show(why)}") from None
        why = "no address"
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._left("connecting"))
                sock.connect(address)
            except TimeoutError:
                sock.close()
                raise HttpTimeout(f"no connection within {_secs(self.timeout_s)} s") from None
            except ConnectionRefusedError:
                sock.close()
                why = "connection refused (nothing listens)"
            except OSError as exc:
                sock.close()
                why = f"cannot connect: {exc.strerror or exc}"
            except BaseException:
                sock.close()
                raise
            else:
                return sock
        raise HttpError(why)

    def send(self, data: bytes) -> None:
        try:
            # sendall's timeout bounds the whole send (Python >= 3.5), not each write.
            self.sock.settimeout(self._left("sending the request"))
            self.sock.sendall(data)
        except TimeoutError:
            raise HttpTimeout(
                f"no complete answer within {_secs(self.timeout_s)} s (the request was not taken)"
            ) from None
        except OSError as exc:
            raise HttpError(f"the request could not be sent: {exc.strerror or exc}") from None

    def more(self, doing: str) -> bool:
        """Read what comes within the time left into buf; False at EOF."""
        try:
            self.sock.settimeout(self._left(doing))
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise HttpTimeout(
                f"no complete answer within {_secs(self.timeout_s)} s ({doing})"
            ) from None
        except OSError as exc:
            raise HttpError(f"the connection failed ({doing}): {exc.strerror or exc}") from None
        self.buf += chunk
        return bool(chunk)

    def read_head(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end > MAX_HEAD:
                raise HttpError(f"the answer's head is more than {MAX_HEAD} bytes")
            if end >= 0:
                head = bytes(self.buf[:end])
                del self.buf[: end + 4]
                return head
            if len(self.buf) > MAX_HEAD:
                raise HttpError(f"the answer's head is more than {MAX_HEAD} bytes")
            got = len(self.buf)
            doing = f"the head came to {got} bytes and no end" if got else "no answer yet"
            if not self.more(doing):
                raise HttpError(
                    f"the connection closed after {got} bytes of the answer's head: no answer"
                    if got
                    else "the connection closed without an answer"
                )

    def read_exactly(self, n: int, doing: str) -> bytes:
        while len(self.buf) < n:
            if not self.more(doing):
                raise HttpError(f"the connection closed before the end: {doing}")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_line(self, limit: int, doing: str) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 2]
                return line
            if len(self.buf) > limit:
                raise HttpError(f"a line of more than {limit} bytes ({doing})")
            if not self.more(doing):
                raise HttpError(f"the connection closed before the end: {doing}")


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    status_line, *lines = head.split(b"\r\n")
    m = _STATUS_LINE.fullmatch(status_line)
    if m is None:
        raise HttpError(f"the answer is not HTTP/1.x: {show(status_line, 120)}")
    headers: dict[str, str] = {}
    if len(lines) > MAX_HEADERS:
        raise HttpError(f"the answer has more than {MAX_HEADERS} header fields")
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HttpError(f"the answer has a malformed header field: {show(line, 120)}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("utf-8", errors="replace")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(m.group(1)), (m.group(2) or b"").decode("utf-8", errors="replace"), headers


def _read_body(conn: _Conn, headers: Mapping[str, str], max_body: int) -> bytes:
    coding = headers.get("transfer-encoding")
    length = headers.get("content-length")
    if coding is not None:
        if length is not None:
            # RFC 9112 6.1: a sign of request smuggling; no real server sends both.
            raise HttpError("the answer has both Transfer-Encoding and Content-Length")
        if coding.strip().lower() != "chunked":
            raise HttpError(f"the answer's Transfer-Encoding {show(coding, 80)} is not chunked")
        return _read_chunked(conn, max_body)
    if length is not None:
        values = {v.strip() for v in length.split(",")}
        # ASCII digits only: str.isdigit() takes "²", which int() then refuses.
        if len(values) != 1 or not _LENGTH.fullmatch(next(iter(values))):
            raise HttpError(f"the answer's Content-Length {show(length, 40)} is not a number")
        n = int(next(iter(values)))
        if n > max_body:
            raise HttpError(f"the answer announces {n} bytes, more than the {max_body} read")
        while len(conn.buf) < n:
            got = len(conn.buf)
            if not conn.more(f"{got} of the {n} bytes its Content-Length announced came"):
                raise HttpError(
                    f"the body ended after {got} of the {n} bytes its Content-Length announced"
                )
        return bytes(conn.buf[:n])
    # Neither: the body ends where the connection does (we asked for Connection: close).
    while conn.more(f"{len(conn.buf)} bytes of a body without a length came"):
        if len(conn.buf) > max_body:
            raise HttpError(f"the answer's body is more than the {max_body} bytes read")
    return bytes(conn.buf)


def _read_chunked(conn: _Conn, max_body: int) -> bytes:
    out = bytearray()
    while True:
        doing = f"{len(out)} bytes of a chunked body came, not its last chunk"
        line = conn.read_line(1024, doing)
        m = _CHUNK_SIZE.fullmatch(line)
        if m is None:
            raise HttpError(f"the answer's chunked body is malformed: {show(line, 80)}")
        size = int(m.group(1), 16)
        if size == 0:
            break
        if len(out) + size > max_body:
            raise HttpError(f"the answer's body is more than the {max_body} bytes read")
        out += conn.read_exactly(size, doing)
        if conn.read_exactly(2, doing) != b"\r\n":
            raise HttpError("the answer's chunked body is malformed: a chunk overruns its size")
    for _ in range(MAX_HEADERS + 1):  # the trailer fields, up to an empty line
        if not conn.read_line(MAX_HEAD, "the chunked body's trailer"):
            return bytes(out)
    raise HttpError(f"the answer's trailer has more than {MAX_HEADERS} fields")


# -- what an answer says --------------------------------------------------------------------------


class NotJson(ValueError):
    """A body that is not the JSON the API promises; the message is escaped."""


def parse_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """The body as UTF-8 JSON nested at most max_depth deep. NaN and Infinity are refused (not
    JSON), and so are integers Python will not read (more than 4300 digits)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJson(f"the answer is not UTF-8 (byte {exc.start}): not JSON") from None
    if json_depth(text) > max_depth:
        raise NotJson(f"the answer is nested more than {max_depth} levels deep")

    def constant(name: str) -> object:
        raise NotJson(f"the answer is not JSON: {name} is no JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except NotJson:
        raise
    except (ValueError, RecursionError):
        raise NotJson("the answer is not JSON") from None


def count(value: object) -> int | None:
    """A non-negative whole number up to MAX_COUNT; None for anything else, and for a bool (a
    JSON true is a bool, and bool is a subclass of int) or a float (1.0 is no count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_COUNT else None


class Redirected(HttpError):
    """A 3xx where an answer must come from the server's own port: what it said, escaped."""

    def __init__(self, answer: Answer, what: str = "an answer") -> None:
        super().__init__(answer.summary(what))
        self.status = answer.status
        #: What it said without its status (for facts that keep the status apart).
        self.note = answer.redirect_note(what)
