"""serving.json from outside (issue 20): a FIFO, /dev/zero, a link to it or a file too large is
refused at once with the file and a fix, by `ct200-serve` and by the doctor's probe alike; wrongly
typed fields are named; a set naming only servers the spec lacks is no empty success for
`ct200-serve smoke`. Real files, FIFOs and devices; `serving.current` is pointed at a file under
tmp_path, as tests/unit/test_serve_cli.py does, so /var/lib/ct200 is never touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ct200_tools.cli import serve
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.serving import probe_serving
from ct200_tools.serve import serving
from ct200_tools.serve.serving import ServingError
from tests.server_sites import llama_site

pytestmark = pytest.mark.timeout(60)


def state(servers: object, **extra: object) -> str:
    return json.dumps({"kind": serving.KIND, "schema_version": 1, "servers": servers, **extra})


def hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "serving.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "too-large":
        with path.open("wb") as fh:
            fh.truncate(serving.MAX_BYTES + 1)  # sparse
    elif kind == "directory":
        path.mkdir()
    return path


KINDS = [
    ("fifo", "FIFO"),
    ("dev-zero-link", "a device"),
    ("too-large", "more than the"),
    ("directory", "a directory"),
]


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_read_state_refuses_what_is_no_file_with_a_fix(
    tmp_path: Path, kind: str, said: str
) -> None:
    path = hostile(tmp_path, kind)
    with pytest.raises(ServingError) as caught:
        serving.read_state(str(path))
    assert said in caught.value.message and str(path) in caught.value.message
    assert "ct200-serve switch" in caught.value.fix and str(path) in caught.value.fix


def test_dev_zero_itself_is_refused_with_a_fix() -> None:
    with pytest.raises(ServingError) as caught:
        serving.read_state("/dev/zero")
    assert "a device" in caught.value.message and caught.value.fix


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_the_doctors_probe_records_it_without_blocking(
    tmp_path: Path, kind: str, said: str
) -> None:
    where = tmp_path / "var" / "lib" / "ct200"
    where.mkdir(parents=True)
    hostile(where, kind)
    r = Reader(root=tmp_path)
    facts = probe_serving(r)
    assert facts.exists and facts.error is not None and said in facts.error
    assert said in r.unreadable["serving"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"switched_at": ["2026"]}, "switched_at"), ({"by": {"x": 1}}, "by")],
)
def test_a_wrongly_typed_field_is_named(
    tmp_path: Path, extra: dict[str, object], field: str
) -> None:
    path = tmp_path / "serving.json"
    path.write_text(state(["tiny"], **extra))
    with pytest.raises(ServingError) as caught:
        serving.read_state(str(path))
    assert f"{field}: expected a string" in caught.value.message
    assert "ct200-serve switch" in caught.value.fix


def test_deep_nesting_is_refused_as_such(tmp_path: Path) -> None:
    path = tmp_path / "serving.json"
    path.write_text(state("@").replace('"@"', "[" * 50_000 + "]" * 50_000))
    with pytest.raises(ServingError, match="nested more than") as caught:
        serving.read_state(str(path))
    assert caught.value.fix


# -- smoke on a set the spec lacks ----------------------------------------------------------------


def smoke_with_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str
) -> int | str | None:
    spec = tmp_path / "site.yml"
    spec.write_text(yaml.safe_dump({"ct200_site": llama_site()}))
    path = tmp_path / "serving.json"
    path.write_text(text)
    real = serving.current
    monkeypatch.setattr(serving, "current", lambda s, p=str(path): real(s, p))
    with pytest.raises(SystemExit) as exited:
        serve.main(["smoke", "--spec", str(spec), "--timeout", "0.5"])
    return exited.value.code


def test_smoke_of_a_set_naming_only_unknown_servers_is_bad_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = smoke_with_state(monkeypatch, tmp_path, state(["gone-a", "gone\x1b[2J"]))
    err = capsys.readouterr().err
    assert code == serve.Exit.BAD_INPUT, err
    assert "gone-a" in err and "gone\\x1b[2J" in err and "\x1b" not in err
    assert "fix:" in err and "ct200-serve switch" in err


def test_smoke_refuses_a_fifo_as_the_serving_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "site.yml"
    spec.write_text(yaml.safe_dump({"ct200_site": llama_site()}))
    fifo = hostile(tmp_path, "fifo")
    real = serving.current
    monkeypatch.setattr(serving, "current", lambda s, p=str(fifo): real(s, p))
    with pytest.raises(SystemExit) as exited:
        serve.main(["smoke", "--spec", str(spec), "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert exited.value.code == serve.Exit.BAD_INPUT, err
    assert "FIFO" in err and "fix:" in err
