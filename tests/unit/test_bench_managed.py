"""ct200-bench's managed mode: each serving set switched to, admitted by the doctor or refused,
measured, with provenance.

The streaming server is real (the stand-in server on 127.0.0.1, tests/unit/bench_helpers). What
cannot exist here is stood in for, and named so: the switch (systemd; the testbed runs the real
one, tests/testbed/test_bench_managed.py), NVML (tests/unit/nvml_standin, the recorded H200).
The doctor's verdict is the real checks judging recorded facts (tests/fixtures/facts), or a
stand-in "ready" where no recording of a passing machine with this spec exists.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ct200_tools.bench import managed, managed_run, session
from ct200_tools.bench.plan import PlanError, load_plan
from ct200_tools.bench.target import Auth
from ct200_tools.bench.view import point_lines
from ct200_tools.cli import bench as cli
from ct200_tools.doctor.checks import for_scope, run_checks, select
from ct200_tools.doctor.report import Header, exit_code, gate_verdict, render_text
from ct200_tools.doctor.scope import Scope
from ct200_tools.facts import read_file
from ct200_tools.spec import SiteSpec, load_spec
from tests.unit import nvml_standin
from tests.unit.bench_helpers import bench, standin

pytestmark = pytest.mark.timeout(180)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STOPPED = FIXTURES / "facts" / "llama-cpu-stopped.json"


def write_site(tmp: Path, port: int, port_b: int | None = None) -> Path:
    """Two servers on the stand-in's port: `set-a` on GPU 0, `set-b` without a GPU (on port_b
    when given: then they can serve side by side)."""

    def server(name: str, gpus: list[int], port: int = port) -> dict[str, object]:
        return {
            "name": name,
            "engine": "command",
            "model": "tiny",
            "gpus": gpus,
            "port": port,
            "enabled": False,
            "command": ["/usr/local/bin/llama-server", "--alias", "standin", "--port", str(port)],
        }

    site = {
        "ct200_site": {
            "gpus": {"count": 1, "model": "NVIDIA H200"},
            "models": [
                {"name": "tiny", "source": "/srv/models/tiny", "staged": "/dev/shm/models/tiny"}
            ],
            "servers": [server("set-a", [0]), server("set-b", [], port_b or port)],
        }
    }
    path = tmp / "site.yml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


def write_plan(tmp: Path, sets: list[object]) -> Path:
    plan = {
        "serving_sets": sets,
        "workloads": [{"name": "w", "input_tokens": 8, "output_tokens": 3, "requests": 2}],
        "concurrency": [1, 2],
        "model": "standin",
    }
    path = tmp / "plan.yml"
    path.write_text(yaml.safe_dump(plan))
    return path


@dataclass(frozen=True)
class SwitchDone:
    """STAND-IN for ct200_tools.serve.switch.Report (the switch needs systemd)."""

    ok: bool = True
    failure: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "failure": self.failure or None, "stand_in": True}


@dataclass
class Switches:
    """STAND-IN switcher: records what it was asked to serve."""

    fail: frozenset[str] = frozenset()
    calls: list[str] = field(default_factory=list)

    def __call__(self, site: SiteSpec, names: Sequence[str]) -> SwitchDone:
        name = " ".join(names)
        self.calls.append(name)
        if name in self.fail:
            return SwitchDone(False, "start: set-b: llama-server exited 1")
        return SwitchDone()


def ready(site: SiteSpec, name: str) -> managed.Readiness:
    """STAND-IN: the doctor found nothing wrong (no recording of a passing check of this spec)."""
    return managed.Readiness(0, (), None, f"benchmark-ready {name}: go (stand-in)", "")


def judged_from(facts_path: Path) -> managed.Checker:
    """The real checks of `ct200-doctor check --server NAME`, judging recorded facts."""
    facts = read_file(facts_path)

    def check(site: SiteSpec, name: str) -> managed.Readiness:
        scope = Scope.of(site, name)
        findings = tuple(run_checks(facts, site, for_scope(select(), scope), scope))
        code = int(exit_code(findings))
        verdict = gate_verdict(findings, name, code).replace("ct200-doctor gate", "benchmark-ready")
        return managed.Readiness(
            code, findings, facts, verdict, render_text(findings, Header(facts, site.source))
        )

    return check


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    with standin("--itl", "0.001") as url:
        yield url, int(url.rsplit(":", 1)[1])


def run(
    tmp: Path,
    port: int,
    sets: list[object],
    *,
    force: bool = False,
    switcher: managed.Switcher | None = None,
    checker: managed.Checker = ready,
    resume: bool = False,
    nvml: nvml_standin.NvmlStandin | None = None,
    port_b: int | None = None,
    auth: Auth | None = None,
) -> tuple[session.Outcome, Path]:
    spec = write_site(tmp, port, port_b)
    out = tmp / "out"
    printed: list[str] = []
    outcome = managed_run.run_managed(
        load_plan(str(write_plan(tmp, sets))),
        managed_run.Managed(
            load_spec(spec),
            str(spec),
            force,
            switcher or Switches(),
            checker,
            nvml or nvml_standin.h200(),
            unit_dir=str(tmp / "units"),
            auth=auth,
        ),
        str(out),
        resume=resume,
        as_json=False,
        argv=["ct200-bench", "run"],
        echo=lambda *a, **k: printed.append(str(a[0]) if a else ""),
        tty=False,
    )
    return outcome, out


def points(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def provenance(out: Path) -> dict[str, object]:
    (run_dir,) = (out / "runs").iterdir()
    data: dict[str, object] = json.loads((run_dir / "provenance.json").read_text())
    return data


def test_a_sweep_over_two_sets_switches_to_each_in_turn(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    url, port = server
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "ct200-server-set-a.service").write_text("[Service]\nExecStart=x\n")
    switches = Switches()
    outcome, out = run(tmp_path, port, ["set-a", "set-b"], switcher=switches)
    assert switches.calls == ["set-a", "set-b"]
    got = points(out)
    assert outcome.points == 4 and outcome.failed_requests == 0
    assert [(p["serving_set"], p["concurrency"]) for p in got] == [
        ("set-a", 1),
        ("set-a", 2),
        ("set-b", 1),
        ("set-b", 2),
    ]
    for p in got:
        assert p["gated"] is True and p["forced"] is False and "gate_failures" not in p
        assert p["target"] == url  # from the spec's port, never typed in the plan
        assert p["requests_completed"] == 2
    gpu_a, gpu_b = got[0]["gpu"], got[2]["gpu"]
    assert isinstance(gpu_a, dict) and isinstance(gpu_b, dict)
    assert gpu_a["before"]["gpus"][0]["sm_clock_mhz"] == 345  # the recorded H200, via NVML
    assert gpu_a["throttled"] == []
    assert "    after: GPU0 SM 345 MHz, 33 C, 80 W" in point_lines(got[0])
    assert gpu_b["before"] == {"available": False, "reason": "the server has no GPUs"}
    prov = provenance(out)
    assert (prov["mode"], prov["gated"], prov["state"], prov["target"]) == (
        "managed",
        True,
        "finished",
        None,
    )
    spec = prov["spec"]
    assert isinstance(spec, dict) and "set-b" in str(spec["text"]) and spec["parsed"]
    sets = prov["sets"]
    assert isinstance(sets, dict) and list(sets) == ["set-a", "set-b"]
    a = sets["set-a"]
    assert a["target"] == url and a["admitted"] is True and a["gate"]["passed"] is True
    assert a["switch"]["stand_in"] is True and a["switch_seconds"] >= 0
    assert a["files"]["unit"]["text"] == "[Service]\nExecStart=x\n"
    assert a["files"]["environment_file"]["text"] is None  # not on this machine: says why
    assert "error" in a["files"]["environment_file"]
    assert a["engine"]["models"]["status"] == 200
    assert a["gpu"]["gpus"][0]["name"] == "NVIDIA H200"


def test_the_doctor_refuses_a_set_with_its_root_cause_and_fix(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    _, port = server
    with pytest.raises(managed.NotReady) as caught:
        run(tmp_path, port, ["set-a"], checker=judged_from(STOPPED))
    exc = caught.value
    assert "set-a is not benchmark-ready: benchmark-ready set-a: no-go" in exc.message
    assert "--force" in exc.fix
    assert any("✗" in line for line in exc.lines)  # the doctor's own text view
    out = tmp_path / "out"
    assert not (out / "results.jsonl").exists()
    prov = provenance(out)
    assert prov["state"] == "refused"
    assert prov["sets"] == {"set-a": {"admitted": False, "refused": exc.message}}


def test_force_runs_anyway_and_records_forced_with_the_findings(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    _, port = server
    # DERIVED from the recorded H200: HW thermal slowdown active (0x40), not recorded.
    hot = dataclasses.replace(nvml_standin.H200_GPU, clocks_event_reasons=0x40)
    outcome, out = run(
        tmp_path,
        port,
        ["set-a"],
        force=True,
        checker=judged_from(STOPPED),
        nvml=nvml_standin.NvmlStandin(gpus=(hot,)),
    )
    assert outcome.points == 2
    for p in points(out):
        assert p["gated"] is True and p["forced"] is True
        failures = p["gate_failures"]
        assert isinstance(failures, list) and failures
        assert all({"id", "status", "summary", "caused_by", "fix"} <= set(f) for f in failures)
        assert p["gpu"]["throttled"] == ["GPU0: HW thermal slowdown"]  # type: ignore[index]
        view = point_lines(p)
        assert "    THROTTLED: GPU0: HW thermal slowdown" in view
        assert any(line.startswith("    FORCED") for line in view)
    sets = provenance(out)["sets"]
    assert isinstance(sets, dict)
    assert sets["set-a"]["forced"] is True and sets["set-a"]["gate"]["passed"] is False
    assert sets["set-a"]["facts"]["hostname"] == "vm"  # the doctor's facts snapshot
    # Recorded without a driver (llama-cpu-stopped.json): said so, not guessed.
    assert sets["set-a"]["driver"] == {"version": None, "cuda_driver_version": None, "gpus": None}
    # The report says how these figures were taken.
    proc = bench("report", str(out), "--out", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    table = (tmp_path / "report" / "table.md").read_text().splitlines()
    assert table[0].endswith("| Accept len | Notes |")
    assert all(row.endswith("| - | forced, throttled |") for row in table[2:])


def test_the_report_plots_acceptance_length_when_points_have_it(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    _, port = server
    _, out = run(tmp_path, port, ["set-b"])
    # The stand-in has no /metrics: the acceptance a vLLM server's counters gave
    # (test_bench_specdec) is added to the recorded points, as a vLLM run would record it.
    got = points(out)
    for p, length in zip(got, (2.5, 3.0), strict=True):
        p["speculative"] = {"engine": "vllm", "acceptance_length": length}
    (out / "results.jsonl").write_text("".join(json.dumps(p) + "\n" for p in got))
    proc = bench("report", str(out), "--out", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count("<svg") == 4 and "Speculative acceptance length" in page
    table = (tmp_path / "report" / "table.md").read_text().splitlines()
    assert [row.split(" | ")[-2] for row in table[2:]] == ["2.50", "3.00"]
    # A drop in acceptance length is a regression compare names.
    new = tmp_path / "new"
    shutil.copytree(out, new)
    for p in got:
        p["speculative"] = {"engine": "vllm", "acceptance_length": 1.5}
    (new / "results.jsonl").write_text("".join(json.dumps(p) + "\n" for p in got))
    proc = bench("compare", str(out), str(new))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("REGRESSION") == 2 and "acceptance_length" in proc.stdout


def test_a_failed_switch_refuses_and_keeps_the_sets_before(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    _, port = server
    with pytest.raises(managed.NotReady) as caught:
        run(tmp_path, port, ["set-a", "set-b"], switcher=Switches(fail=frozenset({"set-b"})))
    assert "ct200-serve switch set-b failed at start: set-b" in caught.value.message
    out = tmp_path / "out"
    assert {p["serving_set"] for p in points(out)} == {"set-a"}
    assert provenance(out)["state"] == "refused"
    # Fixed, --resume continues with set-b only.
    switches = Switches()
    outcome, _ = run(tmp_path, port, ["set-a", "set-b"], switcher=switches, resume=True)
    assert switches.calls == ["set-b"] and outcome.points == 2
    assert [p["serving_set"] for p in points(out)] == ["set-a"] * 2 + ["set-b"] * 2


def test_a_set_the_spec_does_not_have_is_a_plan_error_before_any_switch(tmp_path: Path) -> None:
    switches = Switches()
    with pytest.raises(PlanError) as caught:
        run(tmp_path, 9, ["set-a", "nope"], switcher=switches)
    (issue,) = caught.value.issues
    assert issue.path == "serving_sets[1]" and "set-a, set-b" in issue.fix
    assert switches.calls == []


def test_the_cli_exits_5_when_not_ready_and_prints_the_doctors_fix(
    tmp_path: Path,
    server: tuple[str, int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, port = server
    monkeypatch.setattr(managed, "switch_to", Switches())
    monkeypatch.setattr(managed, "doctor_check", judged_from(STOPPED))
    spec, plan = write_site(tmp_path, port), write_plan(tmp_path, ["set-a"])
    with pytest.raises(SystemExit) as caught:
        cli.main(["run", str(plan), "--spec", str(spec), "--out", str(tmp_path / "out")])
    assert caught.value.code == 5
    err = capsys.readouterr().err
    assert "ct200-bench: refused: set-a is not benchmark-ready" in err
    assert "fix: apply the fix above" in err and "Traceback" not in err


def test_bad_managed_input_is_exit_2(tmp_path: Path) -> None:
    spec, plan = write_site(tmp_path, 9), write_plan(tmp_path, ["set-a", "nope"])
    proc = bench("run", str(plan), "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "serving_sets[1]" in proc.stderr and "nope" in proc.stderr
    missing = bench("run", str(plan), "--spec", str(tmp_path / "no.yml"), "--out", str(tmp_path))
    assert missing.returncode == 2 and "no.yml" in missing.stderr
    assert "Traceback" not in proc.stderr + missing.stderr
    assert not (tmp_path / "out").exists()


def test_the_machine_summary_of_recorded_h200_facts() -> None:
    facts = read_file(FIXTURES / "facts" / "h200-healthy.json")
    got = managed.machine_summary(facts, "none")
    assert got["driver"] == {
        "version": "580.159.04",
        "cuda_driver_version": 13000,
        "gpus": ["NVIDIA H200"],
    }
    assert got["engine_installed"] == {"dist": None, "version": None}


def test_a_set_of_two_servers_is_switched_to_once_and_each_measured_in_turn(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    url_a, port_a = server
    with standin("--itl", "0.001") as url_b:
        port_b = int(url_b.rsplit(":", 1)[1])
        switches = Switches()
        checked: list[str] = []

        def check(site: SiteSpec, name: str) -> managed.Readiness:
            checked.append(name)
            return ready(site, name)

        pair = {"name": "pair", "servers": ["set-a", "set-b"]}
        outcome, out = run(
            tmp_path, port_a, [pair], switcher=switches, checker=check, port_b=port_b
        )
    # One switch to both (they serve side by side), the doctor's check of each, then each
    # server's points in turn, each under SET/SERVER against its own port.
    assert switches.calls == ["set-a set-b"] and checked == ["set-a", "set-b"]
    got = points(out)
    assert outcome.points == 4
    assert [(p["serving_set"], p["server"], p["target"], p["concurrency"]) for p in got] == [
        ("pair/set-a", "set-a", url_a, 1),
        ("pair/set-a", "set-a", url_a, 2),
        ("pair/set-b", "set-b", url_b, 1),
        ("pair/set-b", "set-b", url_b, 2),
    ]
    sets = provenance(out)["sets"]
    assert isinstance(sets, dict) and sorted(sets) == ["pair/set-a", "pair/set-b"]
    assert {s["serving_set"] for s in sets.values()} == {"pair"}
    assert provenance(out)["plan"]["serving_sets"] == [pair]  # type: ignore[index]


def test_servers_that_cannot_serve_side_by_side_are_a_plan_error(tmp_path: Path) -> None:
    switches = Switches()
    with pytest.raises(PlanError) as err:  # both on one port
        run(tmp_path, 9, [{"name": "pair", "servers": ["set-a", "set-b"]}], switcher=switches)
    (issue,) = err.value.issues
    assert issue.path == "serving_sets[0].servers" and "both listen on port 9" in issue.message
    assert switches.calls == []
    with pytest.raises(PlanError) as err:
        run(tmp_path, 9, [{"name": "pair", "servers": ["set-a", "nope"]}], switcher=switches)
    assert [i.path for i in err.value.issues] == ["serving_sets[0].servers[1]"]


def test_a_target_run_refuses_a_set_of_several_servers(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, [{"name": "pair", "servers": ["a", "b"]}])
    proc = bench("run", str(plan), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "--target is one server" in proc.stderr and "Traceback" not in proc.stderr


def test_a_pair_refused_by_one_servers_check_measures_neither_and_resume_measures_the_rest(
    tmp_path: Path, server: tuple[str, int]
) -> None:
    url_a, port_a = server
    pair = {"name": "pair", "servers": ["set-a", "set-b"]}

    def b_not_ready(site: SiteSpec, name: str) -> managed.Readiness:
        if name == "set-b":
            return managed.Readiness(2, (), None, "benchmark-ready set-b: no-go (stand-in)", "")
        return ready(site, name)

    with standin("--itl", "0.001") as url_b:
        port_b = int(url_b.rsplit(":", 1)[1])
        # The doctor refuses the pair's second server: nothing of the pair is measured.
        with pytest.raises(managed.NotReady) as caught:
            run(tmp_path, port_a, [pair], checker=b_not_ready, port_b=port_b)
        assert caught.value.message.startswith("set-b is not benchmark-ready")
        out = tmp_path / "out"
        assert not (out / "results.jsonl").exists() or points(out) == []
        sets = provenance(out)["sets"]
        assert isinstance(sets, dict) and list(sets) == ["pair"]
        assert sets["pair"]["admitted"] is False and "set-b" in sets["pair"]["refused"]
        # Fixed: --resume measures both. Then, as if killed after the first server's points, the
        # second server's are taken out and --resume runs again: one switch to the pair, the
        # first server's points kept, the second's measured.
        run(tmp_path, port_a, [pair], resume=True, port_b=port_b)
        got = points(out)
        assert [p["serving_set"] for p in got] == ["pair/set-a"] * 2 + ["pair/set-b"] * 2
        (out / "results.jsonl").write_text("".join(json.dumps(p) + "\n" for p in got[:2]))
        switches = Switches()
        outcome, _ = run(tmp_path, port_a, [pair], switcher=switches, resume=True, port_b=port_b)
    assert switches.calls == ["set-a set-b"] and outcome.points == 2
    again = points(out)
    assert [p["serving_set"] for p in again] == ["pair/set-a"] * 2 + ["pair/set-b"] * 2
    assert again[:2] == got[:2] and {p["target"] for p in again[2:]} == {url_b}
    assert url_a != url_b


def test_a_managed_run_sends_the_api_key_and_stores_only_its_variables_name(
    tmp_path: Path,
) -> None:
    key = "sk-managed-81c2d0"
    with standin("--api-key", key) as url:
        port = int(url.rsplit(":", 1)[1])
        outcome, out = run(tmp_path, port, ["set-a"], auth=Auth("SITE_KEY", key))
    assert outcome.points == 2 and outcome.failed_requests == 0
    assert all(p["requests_completed"] == 2 for p in points(out))
    assert provenance(out)["api_key_env"] == "SITE_KEY"
    assert all(key not in p.read_text() for p in out.rglob("*") if p.is_file())
