"""Sweep to the knee (plan `sweep.stop_when`) and --max-seconds, against the stand-in server
whose throughput saturates (--max-streams: it generates for N requests at a time, the rest
wait), so the knee is where the server puts it, not where a clock happens to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ct200_tools.bench import aggregate, report
from ct200_tools.bench.knee import StopRule, Tracker
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(240)

#: One request is 8 tokens 20 ms apart: throughput is set by the stand-in's streams.
WORKLOAD = {"name": "w", "input_tokens": 4, "output_tokens": 8, "requests": 6}


def _plan(tmp_path: Path, **extra: object) -> Path:
    plan = {"workloads": [WORKLOAD], "concurrency": [1, 2, 4, 8], **extra}
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(plan))
    return path


def _points(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_the_sweep_stops_where_throughput_stops_growing_and_resume_keeps_it(
    tmp_path: Path,
) -> None:
    """Two streams: c=2 doubles c=1's throughput, c=4 adds nothing; c=8 is never run, also
    not by --resume, and the report marks the knee."""
    plan = _plan(tmp_path, sweep={"stop_when": {"gain_below": 0.5}})
    out = tmp_path / "res"
    with standin("--itl", "0.02", "--max-streams", "2") as url:
        proc = bench("run", str(plan), "--target", url, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        points = _points(out)
        assert [p["concurrency"] for p in points] == [1, 2, 4]
        assert [("knee" in p) for p in points] == [False, False, True]
        knee = points[2]["knee"]
        assert isinstance(knee, dict)
        assert knee["reason"] == "gain" and knee["level"] == 4 and knee["at"] == 2
        assert knee["not_run"] == [8] and knee["gain"] < 0.5
        assert "SWEEP STOPPED: output tok/s gained" in proc.stdout
        assert "the knee is c=2; not run: c=8" in proc.stdout
        assert "3 point(s) recorded (0 before, 1 not run past the knee)" in proc.stdout
        again = bench("run", str(plan), "--target", url, "--out", str(out), "--resume")
        assert again.returncode == 0, again.stderr
        assert len(_points(out)) == 3
        assert "0 point(s) recorded (3 before, 1 not run past the knee)" in again.stdout
    rep = tmp_path / "rep"
    assert bench("report", str(out), "--out", str(rep)).returncode == 0
    rows = (rep / "table.md").read_text().splitlines()[2:]
    assert rows[1].startswith("| target | c=2 |") and rows[1].endswith("ungated, knee |")
    assert rows[2].startswith("| target | c=4 |") and "sweep stopped (gain)" in rows[2]
    page = (rep / "report.html").read_text()
    assert page.count(">knee</text>") == 1  # on the throughput plot only


def test_the_sweep_stops_when_too_few_requests_meet_the_slo(tmp_path: Path) -> None:
    """One stream: at c=2 each request waits for the other's 400 ms, past a TTFT SLO of 200 ms
    that c=1 meets with room for a loaded machine's delays."""
    plan = _plan(
        tmp_path,
        slo={"ttft_ms": 200},
        sweep={"stop_when": {"goodput_below": 0.9}},
        repetitions=2,
    )
    out = tmp_path / "res"
    with standin("--itl", "0.05", "--max-streams", "1") as url:
        proc = bench("run", str(plan), "--target", url, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    points = _points(out)
    assert [(p["concurrency"], p["repetition"]) for p in points] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    knee = points[-1]["knee"]
    assert isinstance(knee, dict)
    assert knee["reason"] == "goodput" and knee["at"] == 1 and knee["not_run"] == [4, 8]
    assert knee["slo_fraction"] < 0.9


def test_max_seconds_cuts_a_point_without_failing_it(tmp_path: Path) -> None:
    """Ten requests of 0.4 s each, one at a time, within 0.5 s: the rest are never sent."""
    out = tmp_path / "res"
    with standin("--itl", "0.05") as url:
        proc = bench(
            "run", "--target", url, "--concurrency", "1", "--input-tokens", "4",
            "--output-tokens", "8", "--requests", "10", "--max-seconds", "0.5", "--out", str(out),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (point,) = _points(out)
    assert point["cut"] is True and point["max_seconds"] == 0.5
    sent = point["requests_sent"]
    assert isinstance(sent, int) and 1 <= sent < 10
    assert point["requests_completed"] == sent and point["requests_failed"] == 0
    assert f"CUT at max_seconds 0.5: {sent} of 10 requests sent" in proc.stdout


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"sweep": {"stop_when": {"goodput_below": 0.9}}}, "goodput_below", "needs an SLO"),
        ({"sweep": {"stop_when": {"gain_below": 0.05}}, "concurrency": [4, 1]}, "concurrency",
         "increasing order"),
        ({"sweep": {"stop_when": {"gain": 0.05}}}, "sweep.stop_when.gain", "unknown key"),
        ({"sweep": {"stop_when": {}}}, "sweep.stop_when", "names no condition"),
        ({"sweep": {"stop_when": {"goodput_below": 2}}, "slo": {"ttft_ms": 1}},
         "goodput_below", "out of range"),
        ({"max_seconds": 0}, "max_seconds", "out of range"),
    ],
)  # fmt: skip
def test_bad_sweep_keys_are_exit_2_naming_the_field(
    tmp_path: Path, extra: dict[str, object], field: str, words: str
) -> None:
    plan = {"workloads": [WORKLOAD], "concurrency": [1, 2], **extra}
    path = tmp_path / "plan.yml"
    path.write_text(yaml.safe_dump(plan))
    proc = bench("run", str(path), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and words in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def _rec(tput: float | None, good: int = 4, done: int = 4) -> dict[str, object]:
    return {
        "output_tokens_per_s": tput,
        "requests_good": good,
        "requests_completed": done,
        "requests_failed": 0,
    }


def test_the_rule_judges_the_mean_over_repetitions() -> None:
    t = Tracker(StopRule(gain_below=0.1), 2, (1, 2, 4, 8))
    key = ("s", "w")
    assert t.seen(key, 1, _rec(100.0)) is None and t.seen(key, 1, _rec(100.0)) is None
    # 150 then 70: a mean of 110, 10 % over 100: not below the bound.
    assert t.seen(key, 2, _rec(150.0)) is None and t.seen(key, 2, _rec(70.0)) is None
    assert t.seen(key, 4, _rec(115.0)) is None  # one repetition: not judged yet
    knee = t.seen(key, 4, _rec(115.0))
    assert knee is not None and knee["at"] == 2 and knee["not_run"] == [8]
    assert t.skips(key, None) and not t.skips(key, 2.0) and not t.skips(("s", "x"), None)


def test_unknown_throughput_never_stops_and_a_recorded_knee_does() -> None:
    t = Tracker(StopRule(gain_below=0.5), 1, (1, 2))
    assert t.seen(("s", "w"), 1, _rec(None)) is None
    assert t.seen(("s", "w"), 2, _rec(None)) is None  # no usage: no figure to judge
    resumed = Tracker(StopRule(gain_below=0.5), 1, (1, 2, 4))
    assert resumed.seen(("s", "w"), 2, {"knee": {"at": 1}}) is None
    assert resumed.skips(("s", "w"), None)


def test_the_report_marks_the_knee_per_configuration(tmp_path: Path) -> None:
    """Two configurations, each with its own knee, in one results directory."""
    out = tmp_path / "res"
    (out / "runs").mkdir(parents=True)
    lines = []
    for label, at in (("a", 2), ("b", 4)):
        for c in (1, 2, 4):
            point: dict[str, object] = {
                "run_id": "r",
                "serving_set": label,
                "workload": {"name": "w"},
                "concurrency": c,
                "request_rate": None,
                "output_tokens_per_s": 10.0 * c,
            }
            if c == 4:
                point["knee"] = {"reason": "gain", "level": 4, "at": at, "message": "m"}
            lines.append(json.dumps(point))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    loaded = aggregate.load([str(out)])
    assert report.knees(loaded) == {("a", "w"): {2}, ("b", "w"): {4}}
    marks = report.knee_marks(loaded, (("output_tokens_per_s", ""),))
    assert marks == {"a": [(2, 20.0)], "b": [(4, 40.0)]}
    notes = {(r[0], r[1]): r[-1] for r in report.rows(loaded)}
    assert notes["a", "c=2"] == "knee" and notes["b", "c=2"] == ""
    assert notes["b", "c=4"] == "knee, sweep stopped (gain)"


def test_a_managed_sweep_stops_at_each_servers_knee_and_resume_switches_to_none(
    tmp_path: Path,
) -> None:
    """Two servers (sets) behind a one-stream stand-in: each stops at c=2; --resume finds
    nothing left and switches to neither. Their points carry an identity whose `args` is the
    digest of the server's rendered unit: a changed unit is another configuration."""
    from ct200_tools.bench import managed_run  # noqa: PLC0415
    from ct200_tools.bench.plan import load_plan  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415
    from tests.unit import nvml_standin  # noqa: PLC0415
    from tests.unit.test_bench_managed import Switches, ready, write_site  # noqa: PLC0415

    plan_path = _plan(
        tmp_path,
        serving_sets=["set-a", "set-b"],
        model="standin",
        sweep={"stop_when": {"gain_below": 0.5}},
    )
    (tmp_path / "units").mkdir()
    unit = tmp_path / "units" / "ct200-server-set-a.service"
    out, out2 = tmp_path / "out", tmp_path / "out2"

    def go(resume: bool, switches: Switches, port: int, out: Path = out) -> None:
        spec = write_site(tmp_path, port)
        managed_run.run_managed(
            load_plan(str(plan_path)),
            managed_run.Managed(
                load_spec(spec), str(spec), False, switches, ready, nvml_standin.h200(),
                unit_dir=str(tmp_path / "units"),
            ),
            str(out), resume=resume, as_json=False, argv=["ct200-bench", "run"],
            echo=lambda *a, **k: None, tty=False,
        )  # fmt: skip

    with standin("--itl", "0.02", "--max-streams", "1") as url:
        port = int(url.rsplit(":", 1)[1])
        unit.write_text("[Service]\nExecStart=llama-server -np 1\n")
        go(False, Switches(), port)
        done = [(p["serving_set"], p["concurrency"]) for p in _points(out)]
        assert done == [("set-a", 1), ("set-a", 2), ("set-b", 1), ("set-b", 2)]
        again = Switches()
        go(True, again, port)
        assert again.calls == [] and len(_points(out)) == 4
        args = {p["serving_set"]: p["identity"]["args"] for p in _points(out)}  # type: ignore[index]
        assert isinstance(args["set-a"], str) and len(args["set-a"]) == 12
        unit.write_text("[Service]\nExecStart=llama-server -np 4\n")
        go(False, Switches(), port, out2)  # the same servers, set-a's unit changed
    loaded = aggregate.load([str(out), str(out2)])
    configs = sorted({g.config for g in loaded.groups})
    assert len(configs) == 3 and configs[2] == "set-b", configs
    assert all(c.startswith("set-a [args ") for c in configs[:2]), configs
