"""`python -m testbed ssh NAME -- COMMAND` runs COMMAND as ssh does: its words joined by spaces into
one string that the remote shell parses, so `-- 'a; b'` runs a, then b. The remote side is a real
`sh -c` here (what sshd runs the string with); the running machine is a STAND-IN (a harness that
lists one machine, and an exec that records its argv instead of starting ssh)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from testbed import cli, ssh
from testbed.config import Settings, Slot


def remote(args: list[str]) -> subprocess.CompletedProcess[str]:
    """What sshd does with the command string after `--`: the login shell's -c."""
    assert args[-2] == "--", args
    return subprocess.run(["sh", "-c", args[-1]], capture_output=True, text=True, check=False)


def slot(tmp_path: Path) -> Slot:
    return Slot(1, Settings.from_env())


def test_words_for_the_harness_stay_words(tmp_path: Path) -> None:
    """The tests' own calls keep each word whole (an argument with a space or a ; is one word)."""
    args = ssh.argv(slot(tmp_path), "10.0.0.1", ["printf", "%s|", "a; b", "c"])
    assert remote(args).stdout == "a; b|c|"


def test_as_ssh_the_remote_shell_parses_the_joined_words(tmp_path: Path) -> None:
    args = ssh.argv(slot(tmp_path), "10.0.0.1", ["echo a; echo", "b"], quote=False)
    assert remote(args).stdout == "a\nb\n"


class StandInHarness:
    """A slot with one machine `ct` up (no machine is booted)."""

    def __init__(self, s: Slot) -> None:
        self.slot = s

    def machines(self) -> list[Any]:
        return [type("M", (), {"name": "ct", "address": "10.0.0.11"})()]


def test_the_cli_runs_the_command_as_ssh_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(cli, "_harness", lambda ctx, s: StandInHarness(slot(tmp_path)))
    monkeypatch.setattr(cli.os, "execvp", lambda prog, args: execs.append(list(args)))
    result = CliRunner().invoke(cli.main, ["ssh", "ct", "--", "echo a; echo b"])
    assert result.exit_code == 0, result.output
    assert len(execs) == 1 and execs[0][0] == "ssh"
    assert "root@10.0.0.11" in execs[0]
    assert remote(execs[0]).stdout == "a\nb\n"
