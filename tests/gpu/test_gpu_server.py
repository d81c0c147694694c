"""A real GPU server under the project's unit, on a real GPU (issue 21, item 1).

llama.cpp's llama-server, built with CUDA from the same vendored source the testbed builds for
the CPU, serves a random-weight llama-shaped GGUF from the testbed's own generator (8 layers,
hidden 2048: about 1.6 GB, so the GPU does real work per token) as a `command` server with
`gpus: [0]`. tests/gpu/unit_run.py starts it exactly as the rendered unit would: ExecStartPre
(preflight, then `ct200-doctor gate`, a real cuInit), ExecStart with the unit's environment in a
kernel cgroup, ExecStartPost (`ct200-serve wait-ready`); then the doctor's server checks, with a
stand-in only for `systemctl show` (systemd is not PID 1 on the GPU machine).

Run on the GPU machine, after `bash tests/gpu/carry_llama.sh` here (carry .gpu-carry):
    python3 -m pytest tests/gpu/test_gpu_server.py -q
With CT200_GPU_OUT=DIR the full report (unit, env, every step's output, the sweep) is kept there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gpu import llama_cuda

pytestmark = pytest.mark.timeout(llama_cuda.BUILD_TIMEOUT_S + 900)

ROOT = Path(__file__).resolve().parents[2]
STAGED = Path("/dev/shm/ct200-gpu-server")
PORT = 18180
#: 8 layers x 2048 hidden, FFN 5632: the shape domain.md section 9 measured (1.5 GB f32).
SHAPE = {"layers": 8, "hidden": 2048, "heads": 16, "ffn": 5632}
#: The sweep, when ct200-bench is there: concurrency 1 and 8, as the issue's figures.
SWEEP = ("1,8", "128", "128", "64")


@pytest.fixture(scope="module")
def llama_server() -> tuple[Path, float]:
    reason = llama_cuda.missing()
    if reason is not None:
        pytest.skip(reason)
    return llama_cuda.ensure()


@pytest.fixture(scope="module")
def model_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testbed import tiny_gguf  # noqa: PLC0415 - needs gguf, carried to the GPU machine

    source = tmp_path_factory.mktemp("models") / "rand"
    source.mkdir()
    tiny_gguf.write(source / "rand.gguf", shape=tiny_gguf.Shape(**SHAPE), name="ct200-gpu-rand")
    return source


def bench_argv(out: Path) -> list[str] | None:
    """ct200-bench's ad-hoc run against {url}, when this checkout has it."""
    if not (ROOT / "ct200_tools" / "cli" / "bench.py").exists():
        return None
    concurrency, input_tokens, output_tokens, requests = SWEEP
    return [
        *(sys.executable, "-m", "ct200_tools.cli.bench", "run", "--target", "{url}"),
        *("--concurrency", concurrency, "--input-tokens", input_tokens),
        *("--output-tokens", output_tokens, "--requests", requests),
        *("--out", str(out), "--json"),
    ]


@pytest.fixture(scope="module")
def report(
    llama_server: tuple[Path, float],
    model_source: Path,
    smi_gpus: list[dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    binary, build_s = llama_server
    tmp = tmp_path_factory.mktemp("unit")
    size_gib = -(-(model_source / "rand.gguf").stat().st_size // (1 << 30))
    doc = {
        "ct200_site": {
            "gpus": {
                "count": len(smi_gpus),
                "model": smi_gpus[0]["name"].removeprefix("NVIDIA ").strip(),
            },
            "models": [
                {
                    "name": "rand",
                    "source": str(model_source),
                    "staged": f"{STAGED}/rand",
                    "size": f"{size_gib}G",
                }
            ],
            "servers": [
                {
                    "name": "gpu",
                    "engine": "llamacpp",
                    "model": "rand",
                    "gpus": [0],  # -ngl 99
                    "port": PORT,
                    "health": "/health",
                    "command": [str(binary)],
                    "args": {"gguf": "rand.gguf", "parallel": 8, "ctx-size": 8192},
                }
            ],
        }
    }
    site = tmp / "site.yml"
    site.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp / "report.json"
    argv = [sys.executable, "-m", "tests.gpu.unit_run", "--site", str(site), "--server", "gpu"]
    argv += ["--report", str(out)]
    sweep = bench_argv(tmp / "bench")
    if sweep is not None:
        argv += ["--sweep", json.dumps(sweep)]
    try:
        subprocess.run(argv, cwd=ROOT, check=True, timeout=1500)
        got: dict[str, Any] = json.loads(out.read_text())
        got["build_s"] = round(build_s, 1)
        keep = os.environ.get("CT200_GPU_OUT")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            Path(keep, "gpu-server-report.json").write_text(json.dumps(got, indent=1))
        yield got
    finally:
        shutil.rmtree(STAGED, ignore_errors=True)  # this test's own staged copy


def test_the_unit_starts_it_through_its_gate(report: dict[str, Any]) -> None:
    assert "error" not in report, report.get("error")
    assert report["stage"]["rc"] == 0, report["stage"]
    pre = report["exec_start_pre"]
    assert [step["argv"][1] for step in pre] == ["preflight", "gate"], pre
    for step in pre:
        assert step["rc"] == 0, step
    assert "go" in pre[1]["stdout"] + pre[1]["stderr"], pre[1]
    assert report["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert report["exec_start"][0].endswith("llama-server")
    assert report["exec_start_post"]["rc"] == 0, (report["exec_start_post"], report)


def test_every_server_check_passes_and_nvml_sees_it_on_gpu_0(report: dict[str, Any]) -> None:
    doctor = report["doctor"]
    findings = {c["id"]: c for c in json.loads(doctor["stdout"])["checks"]}
    for cid, finding in findings.items():
        if cid == "server.quant":  # a GGUF has no compressed-tensors format: not applicable
            assert finding["status"] == "skip", finding
            continue
        assert finding["status"] == "pass", finding
    assert {"server.unit", "server.gpus", "server.generate", "models.staged"} <= set(findings)
    assert findings["server.gpus"]["summary"].endswith("on GPUs 0 (NVML)"), findings
    assert doctor["rc"] == 0, doctor
    # Ground truth beside the doctor: nvidia-smi lists the server's process on GPU 0's bus.
    apps = {int(a["pid"]): a["gpu_bus_id"] for a in report["compute_apps"]}
    assert report["main_pid"] in apps, report["compute_apps"]
    assert apps[report["main_pid"]] == report["gpu_bus_ids"][0]


def test_a_sweep_measures_it(report: dict[str, Any]) -> None:
    if "sweep" not in report:
        pytest.skip("this checkout has no ct200-bench")
    sweep = report["sweep"]
    assert sweep["rc"] == 0, sweep
    points = [json.loads(line) for line in sweep["stdout"].splitlines() if line.startswith("{")]
    assert [p["concurrency"] for p in points] == [1, 8], points
    for point in points:
        assert point["requests_failed"] == 0, point
        assert point["output_tokens_per_s"] > 0, point
