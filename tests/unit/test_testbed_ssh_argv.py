"""`python -m testbed ssh NAME -- COMMAND` passes COMMAND as ssh(1) does (issue 19): the words
joined by spaces for the machine's shell, so `-- 'a; b'` runs a, then b. The harness and the
tests keep quoting word by word (their argv reaches the machine exactly). The string ssh sends
is run here by a real shell, as sshd hands it to the login shell."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from testbed import cli, ssh
from testbed.config import Settings, Slot
from testbed.harness import Harness
from testbed.machine import Machine

SLOT = Slot(0, Settings.from_env())


def remote(command: list[str], quote: bool) -> str:
    """What the machine's shell prints for the string this argv sends (ssh's last argument)."""
    args = ssh.argv(SLOT, "192.0.2.1", command, quote=quote)
    assert args[-2] == "--"
    return shell(args[-1])


def shell(line: str) -> str:
    """What sh prints for ``line``, as sshd hands a command to the login shell."""
    proc = subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, timeout=10, check=False
    )
    return proc.stdout


def test_the_cli_passes_a_command_line_as_ssh_does() -> None:
    assert remote(["echo a; echo b"], quote=False) == "a\nb\n"
    assert remote(["echo", "x", "&&", "echo", "y"], quote=False) == "x\ny\n"


def test_the_harness_keeps_each_word_whole() -> None:
    assert remote(["echo", "a; echo b"], quote=True) == "a; echo b\n"


def test_the_cli_passes_its_command_as_ssh_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `ssh` command, parsed by click as typed: the ssh it would exec (replaced here by a
    recorder: no machine runs in a unit test, a STAND-IN for the slot's one machine) sends the
    words joined by spaces, which a real shell runs as two commands."""
    ct = Machine("ct", "ct", "192.0.2.1", 1, "netns", "/nonexistent", "/nonexistent")
    monkeypatch.setattr(Harness, "machines", lambda self: [ct])
    execs: list[list[str]] = []

    def recorded(file: str, args: list[str]) -> None:
        execs.append(args)
        raise SystemExit(0)

    monkeypatch.setattr(cli.os, "execvp", recorded)
    got = CliRunner().invoke(cli.main, ["ssh", "ct", "--", "echo a; echo b"])
    assert got.exit_code == 0, got.output
    (args,) = execs
    assert args[-2:] == ["--", "echo a; echo b"]
    assert shell(args[-1]) == "a\nb\n"
