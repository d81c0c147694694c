"""Repetitions are repetitions of one thing: points pool in `report` and `compare` only when their
identity (host, server, engine and version, model and its size, server arguments) agrees.

Runs are real (the CLI against the stand-in server); results of older versions and of fetched
managed runs are written as those versions wrote them (no `identity` in a point).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ct200_tools.bench import aggregate, compare, identity, report
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(180)

RUN = ("--concurrency", "1", "--input-tokens", "4", "--output-tokens", "4", "--requests", "2")


def _run(url: str, out: Path) -> None:
    proc = bench("run", "--target", url, *RUN, "--out", str(out))
    assert proc.returncode == 0, proc.stderr


def _table(out: Path) -> list[str]:
    return (out / "table.md").read_text().splitlines()[2:]


def test_two_models_behind_one_label_are_two_configurations(tmp_path: Path) -> None:
    """The issue's case: a 1.6 MB model, then a 1.5 GB one, same served name, same port, both
    under the default label `target`."""
    out = tmp_path / "res"
    with standin("--model-meta", "800000") as url:
        _run(url, out)
    port = url.rsplit(":", 1)[1]
    with standin("--model-meta", "750000000", "--port", port) as again:
        assert again == url
        _run(url, out)
    points = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [p["identity"]["n_params"] for p in points] == [800000, 750000000]
    assert points[0]["identity"]["engine"] == "llama-server"
    rep = bench("report", str(out), "--out", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr
    rows = _table(tmp_path / "rep")
    assert len(rows) == 2, rows
    assert rows[0].startswith("| target [750 Mparams, 1.5 GB] | c=1 | 1 |"), rows
    assert rows[1].startswith("| target [800 kparams, 1.6 MB] | c=1 | 1 |"), rows
    assert "target is split into 2 configurations" in rep.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<li>target [800 kparams, 1.6 MB]: host " in page
    assert "engine llama-server, version standin, model standin, 800 kparams, 1.6 MB" in page
    assert "differ in n_params, model_size" in rep.stderr


def test_the_same_server_twice_pools_as_two_repetitions(tmp_path: Path) -> None:
    out = tmp_path / "res"
    with standin("--model-meta", "800000") as url:
        _run(url, out)
        _run(url, out)
    loaded = aggregate.load([str(out)])
    assert [(g.config, len(g.points)) for g in loaded.groups] == [("target", 2)]
    assert loaded.notes == []


def test_hosts_split_and_compare_pairs_each_host_with_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.yml names each container by $CT200_BENCH_HOST: one server measured from two
    hosts is two configurations, and compare matches host with host."""
    old, new = tmp_path / "old", tmp_path / "new"
    with standin() as url:
        for host in ("host-a", "host-b"):
            monkeypatch.setenv(identity.HOST_ENV, host)
            _run(url, old)
            _run(url, new)
    loaded = aggregate.load([str(old)])
    assert sorted(g.config for g in loaded.groups) == ["target [host-a]", "target [host-b]"]
    changes = compare.compare(loaded, aggregate.load([str(new)]))
    pairs = {(c.config, c.old_config) for c in changes}
    assert pairs == {("target [host-a]", None), ("target [host-b]", None)}
    # NEW measured host-a only, unsplit: paired with OLD's host-a, by host and model.
    groups = aggregate.load([str(new)]).groups
    only_a = aggregate.Loaded([g for g in groups if g.identity["host"] == "host-a"], 0, {})
    aggregate.split(only_a.groups)
    assert [g.config for g in only_a.groups] == ["target"]
    assert {(c.config, c.old_config) for c in compare.compare(loaded, only_a)} == {
        ("target", "target [host-a]")
    }
    # The other way round, OLD's host-b finds no partner: a note, not a wrong comparison.
    ps, notes = compare.pairs(only_a, loaded)
    assert [(o.config, n.config) for o, n in ps] == [("target", "target [host-a]")]
    assert len(notes) == 1 and notes[0].startswith("target [host-b] / adhoc c=1: not compared")
    cli = bench("compare", str(old), str(new))
    assert cli.returncode in (0, 1), cli.stderr  # one repetition a side: noise may flag
    assert "2 configurations: its points differ in host" in cli.stdout


def _old_store(root: Path, host: str, prov: dict[str, object], label: str) -> None:
    """A results directory as ct200-bench wrote it before points carried an identity."""
    run_id = f"20261201T000000Z-{host}"
    (root / "runs" / run_id).mkdir(parents=True)
    (root / "runs" / run_id / "provenance.json").write_text(
        json.dumps({"run_id": run_id, "host": host, **prov})
    )
    point = {
        "run_id": run_id,
        "serving_set": label,
        "workload": {"name": "short"},
        "concurrency": 8,
        "request_rate": None,
        "output_tokens_per_s": 1000.0 + len(host),
    }
    (root / "results.jsonl").write_text(json.dumps(point) + "\n")


def _engine(name: str, model: str) -> dict[str, object]:
    props = {"url": "/props", "status": 200, "data": {"build_info": "b1", "model_path": model}}
    return {"props": props, "engine": {"name": name, "version": "b1"}}


def test_old_points_take_their_identity_from_the_runs_provenance(tmp_path: Path) -> None:
    """Three containers' managed results fetched by bench.yml (DIR/<host>/results), written
    before points had an identity: three configurations, and the run list names each set's
    engine and model (it said "engine None, model None")."""
    dirs = []
    for host in ("ct-a", "ct-b", "ct-c"):
        sets = {
            "qwen-tp4": {
                "engine": _engine("llama-server", "/models/q.gguf"),
                "model": "qwen",
                "target": "http://127.0.0.1:30000",
            }
        }
        prov = {"mode": "managed", "gated": True, "target": None, "sets": sets}
        _old_store(tmp_path / host / "results", host, prov, "qwen-tp4")
        dirs.append(str(tmp_path / host / "results"))
    loaded = aggregate.load(dirs)
    assert [g.config for g in loaded.groups] == [
        "qwen-tp4 [ct-a]",
        "qwen-tp4 [ct-b]",
        "qwen-tp4 [ct-c]",
    ]
    assert all(g.identity["model_path"] == "/models/q.gguf" for g in loaded.groups)
    lines = report.run_lines(loaded)
    assert len(lines) == 3
    assert all("qwen-tp4: engine llama-server, model qwen" in line for line in lines), lines
    assert "engine None" not in "".join(lines) and "model None" not in "".join(lines)


def test_old_target_runs_pool_when_their_provenance_agrees(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        engine = _engine("e", "/p")
        prov = {"mode": "target", "target": "http://x:1", "model": "m", "engine": engine}
        _old_store(d, "same-host", prov, "target")
    loaded = aggregate.load([str(a), str(b)])
    assert [(g.config, len(g.points)) for g in loaded.groups] == [("target", 2)]


def test_split_names_are_escaped_in_every_format(tmp_path: Path) -> None:
    for n, host in enumerate(("a&<b>", "c|d_e")):
        prov = {"mode": "target", "target": "http://x:1", "model": "m"}
        _old_store(tmp_path / str(n), host, prov, "set\x1b[31m")
    loaded = aggregate.load([str(tmp_path / "0"), str(tmp_path / "1")])
    written = report.write(loaded, str(tmp_path / "rep"))
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "a&amp;&lt;b&gt;" in page and "<b>" not in page and "\x1b" not in page
    assert "c\\|d_e" in (tmp_path / "rep" / "table.md").read_text()
    assert r"c|d\_e" in (tmp_path / "rep" / "table.tex").read_text()
    assert any("split into 2 configurations" in n and "\x1b" not in n for n in written.notes)


def test_points_without_identity_or_provenance_say_so(tmp_path: Path) -> None:
    _old_store(tmp_path, "h", {}, "target")
    for run in (tmp_path / "runs").iterdir():
        (run / "provenance.json").unlink()
    loaded = aggregate.load([str(tmp_path)])
    assert [g.config for g in loaded.groups] == ["target"]
    assert loaded.notes == [
        "1 point(s) carry no identity and their run has no provenance: they pool by serving "
        "set alone (whatever server they measured)"
    ]
