"""The target: its base URL checked before anything is sent, and the API key it may need.

A --target is printed and stored (provenance, every point), so it must be a plain base URL: every
malformed one is refused with what is wrong, and one with user:password@ is refused without
showing the password; an API key goes in an environment variable instead (`--api-key-env VAR`).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from ct200_tools.untrusted import show


@dataclass(frozen=True)
class Auth:
    """An API key sent as `Authorization: Bearer` (vLLM's and SGLang's --api-key). Only the
    variable's name is ever shown or stored; the key is kept out of repr."""

    env: str
    key: str = field(repr=False)

    @classmethod
    def from_env(cls, name: str) -> Auth:
        """The key in environment variable `name`; ValueError (naming the variable, never the
        value) when it is unset, empty or no single printable word."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
            raise ValueError(f"{show(name, 60)} is not an environment variable's name")
        key = os.environ.get(name)
        if key is None:
            raise ValueError(f"the environment variable {name} is not set")
        if not key:
            raise ValueError(f"the environment variable {name} is empty")
        if len(key) > 4096 or not all(c.isascii() and c.isprintable() and c != " " for c in key):
            raise ValueError(
                f"the environment variable {name} is not one word of printable ASCII "
                "(an API key has no spaces, newlines or control characters)"
            )
        return cls(name, key)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


_USERINFO = re.compile(r"(//)[^/?#]*@")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
MAX_URL: Final = 2048
#: What urlsplit lets by and the URL library that sends refuses: "http://[::1]x", a port in
#: fullwidth digits.
_NETLOC = re.compile(r"(\[[^\[\]/]+\]|[^\[\]:/]+)(:[0-9]{0,5})?")


class CredentialsInUrl(ValueError):
    """A --target with user:password@: refused, the password never shown."""


def redact(url: str) -> str:
    """The URL with any user:password@ replaced by ***@, for messages."""
    return _USERINFO.sub(r"\1***@", url)


def _host_error(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    if not host.isascii():
        return "has a host that is not ASCII; write an international name in its xn-- form"
    name = host.removesuffix(".")
    if len(name) > 253:
        return f"has a host name of {len(name)} characters, more than DNS allows (253)"
    for label in name.split("."):
        if not _LABEL.fullmatch(label):
            return (
                f"has a host name with the label {show(label, 40)}: a label is 1 to 63 letters, "
                "digits or hyphens, not starting or ending with a hyphen"
            )
    return None


def check_target(value: str) -> str:
    """`value` as a server's base URL (trailing slashes dropped); ValueError with a message
    that shows the value escaped, its password never, and says what is wrong."""
    shown = show(redact(value), 120)
    if len(value) > MAX_URL:
        raise ValueError(f"{shown} is longer than {MAX_URL} characters: no server's base URL")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"{shown} has whitespace or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
        host = parts.hostname
        user = parts.username
    except ValueError as exc:
        # urllib says "Port out of range", "Port could not be cast", "Invalid IPv6 URL".
        port_bad = "port" in str(exc).lower()
        what = "its port is not a number from 1 to 65535" if port_bad else "its host is malformed"
        raise ValueError(f"{shown} is not a URL that can be read: {what}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{shown} is not an http:// or https:// URL")
    if user is not None or "@" in parts.netloc:
        raise CredentialsInUrl(
            f"{shown} carries a user name or password: a URL is printed and stored, a password "
            "must not be; put an API key in an environment variable and pass --api-key-env "
            "VARIABLE (sent as Authorization: Bearer, as vLLM's and SGLang's --api-key expect)"
        )
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError(f"{shown} has a query or fragment: a base URL has neither")
    if not host:
        raise ValueError(f"{shown} names no host")
    if not _NETLOC.fullmatch(parts.netloc):
        raise ValueError(f"{shown} is not HOST, HOST:PORT or [IPv6]:PORT before its path")
    if port == 0:
        raise ValueError(f"{shown} has port 0: give the port the server listens on")
    bad_host = _host_error(host)
    if bad_host is not None:
        raise ValueError(f"{shown} {bad_host}")
    return value.rstrip("/")
