"""--target and --api-key-env: every malformed URL is exit 2 with what is wrong (never 3, never a
traceback, never a raw control character), a password in the URL is refused without being shown,
and an API key from the environment goes to the server on every request but nowhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ct200_tools.bench.target import Auth, check_target, redact
from ct200_tools.cli.bench import main
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(300)

ADHOC = ("--concurrency", "1", "--input-tokens", "8", "--output-tokens", "4", "--requests", "2")


def plain(text: str) -> bool:
    """No control character but the newline: a terminal shows it as it is."""
    return all(c == "\n" or (c.isprintable() and c != "\x7f") for c in text)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("http://[::1", "is not a URL that can be read: its host is malformed"),
        ("http://" + "a" * 300 + ":8000", "has a host name of 300 characters"),
        ("http://" + "a" * 64 + ".example:8000", "a label is 1 to 63 letters"),
        ("http://-x-.example:8000", "a label is 1 to 63"),
        ("http://host:99999", "its port is not a number from 1 to 65535"),
        ("http://host:80x", "its port is not a number from 1 to 65535"),
        ("http://host:0", "has port 0"),
        ("http://host:8000/#top", "has a query or fragment"),
        ("http://host:8000/?a=1", "has a query or fragment"),
        ("http://ho st:8000", "has whitespace or control characters"),
        ("http://host\x1b[2J:8000", "has whitespace or control characters"),
        ("ftp://host", "is not an http:// or https:// URL"),
        ("127.0.0.1:8000", "is not an http:// or https:// URL"),
        ("http://:8000", "names no host"),
        ("http://[::1]x:8000", "is not HOST, HOST:PORT or [IPv6]:PORT"),
        ("http://host:\uff18\uff10", "is not"),
        ("http://hôst:8000", "xn-- form"),
    ],
)
def test_a_malformed_target_is_exit_2_saying_what_is_wrong(
    tmp_path: Path, target: str, message: str
) -> None:
    proc = bench("run", "--target", target, *ADHOC, "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "e.g. http://127.0.0.1:30000" in proc.stderr
    assert "Traceback" not in proc.stderr and plain(proc.stderr)
    assert not (tmp_path / "results.jsonl").exists()


def test_good_targets_are_kept() -> None:
    for url in ("http://127.0.0.1:30000/", "https://gpu-1.lab:8000", "http://[::1]:80",
                "http://host.example.:8000/prefix"):  # fmt: skip
        assert check_target(url) == url.rstrip("/")


def test_a_password_in_the_target_is_refused_and_never_shown(tmp_path: Path) -> None:
    proc = bench("run", "--target", "http://bench:hunter2@127.0.0.1:9", *ADHOC, "--out",
                 str(tmp_path))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout
    assert "http://***@127.0.0.1:9 carries a user name or password" in proc.stderr
    assert "--api-key-env VARIABLE" in proc.stderr and "Authorization: Bearer" in proc.stderr
    # Malformed as well: still not shown.
    assert "hunter2" not in redact("http://u:hunter2@[::1")


def _exit_code(target: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        main(["run", "--target", target, *ADHOC, "--timeout", "0.2", "--out", str(out)])
    code = ended.value.code
    return code if isinstance(code, int) else -1, capsys.readouterr().err


URLISH = st.builds(
    lambda scheme, host, port, rest: f"{scheme}{host}{port}{rest}",
    st.sampled_from(["http://", "https://", "http:", "", "HTTP://", "http:///"]),
    st.text(max_size=30) | st.sampled_from(["[::1", "[::1]", "127.0.0.1", "u:p@h", "a" * 300]),
    st.sampled_from(["", ":", ":0", ":9", ":65536", ":-1", ":x"]) | st.text(max_size=6),
    st.text(max_size=12),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.text(max_size=60) | URLISH)
def test_any_target_is_exit_0_to_2_never_3_nor_a_traceback(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _exit_code(target, tmp_path / "out", capsys)
    assert code in (0, 1, 2), err
    assert "Traceback" not in err and "internal error" not in err.lower()
    assert plain(err), err


def test_the_api_key_goes_to_the_server_and_nowhere_else(tmp_path: Path) -> None:
    key = "sk-test-3f9a1c77e2"
    out = tmp_path / "out"
    with standin("--api-key", key) as url:
        without = bench("run", "--target", url, *ADHOC, "--out", str(tmp_path / "no"))
        proc = bench("run", "--target", url, *ADHOC, "--api-key-env", "BENCH_KEY", "--json",
                     "--out", str(out), env={"BENCH_KEY": key})  # fmt: skip
        wrong = bench("run", "--target", url, *ADHOC, "--api-key-env", "BENCH_KEY", "--out",
                      str(tmp_path / "wrong"), env={"BENCH_KEY": "sk-wrong-0000"})  # fmt: skip
    assert without.returncode == 2, without.stderr
    assert "HTTP 401, the server wants an API key" in without.stderr
    assert "fix: put the server's key in an environment variable and pass --api-key-env" in (
        without.stderr
    )
    # Info requests and completions carried it: the model found, every request answered.
    assert proc.returncode == 0, proc.stderr
    (point,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert point["requests_completed"] == 2 and point["workload"]["prompt_length_method"] == (
        "tokenize"
    )
    assert wrong.returncode == 2 and "refused the one in BENCH_KEY" in wrong.stderr
    assert "sk-wrong-0000" not in wrong.stderr + wrong.stdout
    (run_dir,) = (out / "runs").iterdir()
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["api_key_env"] == "BENCH_KEY" and "BENCH_KEY" in prov["command"]
    for text in (proc.stdout, proc.stderr, *(p.read_text() for p in out.rglob("*") if p.is_file())):
        assert key not in text
    assert key not in repr(Auth("BENCH_KEY", key))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "the environment variable BENCH_KEY_UNSET is not set"),
        ({"BENCH_KEY_UNSET": ""}, "the environment variable BENCH_KEY_UNSET is empty"),
        ({"BENCH_KEY_UNSET": "two words"}, "is not one word of printable ASCII"),
    ],
)
def test_a_missing_or_empty_key_variable_is_exit_2_naming_it(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    proc = bench("run", "--target", "http://127.0.0.1:9", *ADHOC, "--api-key-env",
                 "BENCH_KEY_UNSET", "--out", str(tmp_path), env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "two words" not in proc.stderr
