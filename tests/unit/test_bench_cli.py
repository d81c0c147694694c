"""ct200-bench run end to end: the real CLI in a subprocess against the stand-in server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ct200_tools.bench.results import Store
from tests.foreground import foreground
from tests.unit.bench_helpers import BENCH, REPO, bench, standin

pytestmark = pytest.mark.timeout(180)

ADHOC = ("--input-tokens", "16", "--output-tokens", "4", "--requests", "4")
POINT_KEYS = {
    "schema_version",
    "concurrency",
    "requests_completed",
    "requests_failed",
    "output_tokens",
    "duration_s",
    "output_tokens_per_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
}


def lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in data.splitlines()]


def test_adhoc_json_is_one_object_per_point_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with standin("--itl", "0.005") as url:
        proc = bench(
            "run", "--target", url, "--concurrency", "1,4", *ADHOC, "--out", str(out), "--json"
        )
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [p["concurrency"] for p in printed] == [1, 4]
    for p in printed:
        assert set(p) >= POINT_KEYS
        assert p["schema_version"] == 1
        assert p["requests_completed"] == 4 and p["output_tokens"] == 16
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(p[key]) == {"mean", "p50", "p90", "p99"}
        assert p["workload"]["prompt_length_method"] == "tokenize"
        # The stand-in counts a word a token: /tokenize made the prompts exactly 16 long.
        assert p["input_tokens"] == 4 * 16
    assert lines(out / "results.jsonl") == printed
    (run_dir,) = (out / "runs").iterdir()
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["state"] == "finished" and prov["gated"] is False
    assert prov["target"] == url and prov["model"] == "standin"
    assert prov["engine"]["engine"] == {"name": "llama-server", "version": "standin"}
    assert prov["command"][:2] == ["ct200-bench", "run"]
    assert prov["started"] <= prov["finished"]


def test_a_server_that_dies_is_recorded_as_errors_and_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Five requests a point: the server dies at its 3rd completion (prompts are made through
    # /tokenize, not counted), in the first point; the second point finds nothing listening.
    with standin("--die-after", "3") as url:
        proc = bench("run", "--target", url, "--concurrency", "1,2", *ADHOC, "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    points = lines(out / "results.jsonl")
    assert [(p["requests_completed"], p["requests_failed"]) for p in points] == [(2, 2), (0, 4)]
    assert "FAILED" in proc.stdout and "cannot connect" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_kill_9_mid_run_keeps_finished_points_and_resume_finishes_the_rest(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    results = out / "results.jsonl"
    args = [
        "run",
        "--concurrency",
        "1,2,3,4,5",
        "--input-tokens",
        "4",
        "--output-tokens",
        "5",
        "--requests",
        "2",
        "--out",
        str(out),
    ]
    with standin("--itl", "0.1") as url:
        proc = subprocess.Popen(
            [*BENCH, *args, "--target", url],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            results.exists() and results.read_bytes().count(b"\n") >= 2
        ):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        kept = lines(results)
        assert 2 <= len(kept) < 5
        resumed = bench(*args, "--target", url, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after {len(kept)} point(s)" in resumed.stdout
    points = lines(results)
    assert points[: len(kept)] == kept
    assert sorted(p["concurrency"] for p in points) == [1, 2, 3, 4, 5]
    assert len({p["run_id"] for p in points}) == 1
    (run_dir,) = (out / "runs").iterdir()
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["state"] == "finished" and len(prov["resumed"]) == 1


def test_ctrl_c_keeps_finished_points_and_marks_the_run_interrupted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = out / "results.jsonl"
    # The stand-in answers the first point's completions (2, or 3 with a warm-up) and none after
    # the third: the run cannot end before the signal, however slow this machine is.
    with standin("--itl", "0.01", "--stall-after", "3") as url:
        proc = subprocess.Popen(
            foreground([*BENCH, "run", "--target", url, "--concurrency", "1,2,3",
                        "--input-tokens", "4", "--output-tokens", "5", "--requests", "2",
                        "--out", str(out)]),
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (results.exists() and results.read_bytes()):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    assert 1 <= len(lines(results)) < 3
    (run_dir,) = (out / "runs").iterdir()
    assert json.loads((run_dir / "provenance.json").read_text())["state"] == "interrupted"


def test_what_the_server_says_of_itself_is_shown_escaped_and_kept_exact(tmp_path: Path) -> None:
    hostile = "evil\x1b[2J\rfleet: ok"
    out = tmp_path / "out"
    with standin("--model-id", hostile) as url:
        proc = bench("run", "--target", url, "--concurrency", "1", *ADHOC, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    assert "evil\\x1b[2J\\rfleet: ok" in proc.stdout
    (point,) = lines(out / "results.jsonl")
    assert point["model"] == hostile  # JSON keeps the exact value


def test_an_out_that_is_a_file_is_exit_4_with_its_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with standin() as url:
        proc = bench("run", "--target", url, "--concurrency", "1", *ADHOC, "--out",
                     str(tmp_path / "file"))  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "fix: pass as --out a directory you can write" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_while_the_run_still_runs_is_refused_and_adds_nothing(tmp_path: Path) -> None:
    """Two writers of one run would measure its remaining points twice (with the same prompts,
    which are seeded by the run and the point). The live run holds its directory's lock; a
    --resume beside it is exit 4 and adds nothing; a run killed outright holds no lock."""
    out = tmp_path / "out"
    results = out / "results.jsonl"
    args = ["run", "--concurrency", "1,2,3", "--input-tokens", "4", "--output-tokens", "5",
            "--requests", "2", "--out", str(out)]  # fmt: skip
    # The stand-in answers the first point's completions (2, or 3 with a warm-up) and none after
    # the third: the run is still running when --resume comes, however slow this machine is.
    with standin("--itl", "0.01", "--stall-after", "3") as url:
        proc = subprocess.Popen(
            [*BENCH, *args, "--target", url], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (results.exists() and results.read_bytes()):
                time.sleep(0.05)
            before = results.read_bytes()
            beside = bench(*args, "--target", url, "--resume")
            assert beside.returncode == 4, beside.stderr
            assert "still running in another process" in beside.stderr, beside.stderr
            assert "resuming after" not in beside.stdout and "Traceback" not in beside.stderr
            assert results.read_bytes() == before
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    store = Store(out)
    run_id = store.last_run()
    assert run_id is not None
    store.claim(run_id)  # the killed run's lock went with it: a --resume may take the run now
    store.release()


def test_resume_with_another_plan_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with standin() as url:
        first = bench("run", "--target", url, "--concurrency", "1", *ADHOC, "--out", str(out))
        assert first.returncode == 0, first.stderr
        again = bench(
            "run", "--target", url, "--concurrency", "2", *ADHOC, "--out", str(out), "--resume"
        )
    assert again.returncode == 2
    assert "another plan, target or label" in again.stderr and "fix:" in again.stderr
    assert len(lines(out / "results.jsonl")) == 1


@pytest.mark.parametrize("model", [[], ["--model", "m"]])
def test_an_unreachable_target_is_exit_2_with_a_fix_and_no_traceback(
    tmp_path: Path, model: list[str]
) -> None:
    with standin() as url:
        pass  # the port is free again once the stand-in is gone
    proc = bench(
        "run", "--target", url, "--concurrency", "1,2", *ADHOC, *model, "--out", str(tmp_path)
    )
    assert proc.returncode == 2, proc.stderr
    # Even with --model: a target that answers nothing gets no 0 tok/s points.
    assert f"{url} did not answer: GET /v1/models" in proc.stderr
    assert "cannot connect" in proc.stderr and "fix: check that the server runs" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "ftp://x", "--concurrency", "1", *ADHOC], "is not an http:// or https://"),
        (["--target", "http://127.0.0.1:9", "--concurrency", "0", *ADHOC], "below 1"),
        (["--target", "http://127.0.0.1:9", "--concurrency", "1,x", *ADHOC], "not a number"),
        (["--target", "http://127.0.0.1:9", *ADHOC], "--concurrency LIST"),
        (["--concurrency", "1", *ADHOC], "or --target URL for a server"),
        (
            ["--target", "http://127.0.0.1:9", "--concurrency", "1", *ADHOC, "--force"],
            "never switched nor gated",
        ),
        (["plan.yml", "--label", "x"], "a run without --target measures the plan's"),
        (
            ["--target", "http://127.0.0.1:9", "--concurrency", "1", *ADHOC, "--label", "a\x1b"],
            "is no name",
        ),
    ],
)
def test_bad_options_are_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = bench("run", *args, "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_that_contradicts_the_stream_is_a_failed_request_not_a_figure(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    with standin("--usage-tokens", "1000000000000") as url:
        proc = bench("run", "--target", url, "--concurrency", "1", *ADHOC, "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    (point,) = lines(out / "results.jsonl")
    assert point["errors"] == {
        "usage says 1000000000000 completion tokens, more than the 4 max_tokens asked": 4
    }
    assert point["requests_completed"] == 0 and not point["output_tokens_per_s"]
