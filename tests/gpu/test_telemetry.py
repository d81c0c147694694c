"""ct200-bench's GPU telemetry (bench/telemetry.py) with the real pynvml on a real GPU (issue 21).

Its unit tests run against a stand-in pynvml; this one samples GPU 0 through the machine's NVML
before, during and after a few seconds of real CUDA work (torch matmuls), and checks what must
hold on a real GPU: every field read (none `unread`), clocks and power above zero, a sane
temperature, the event-reason mask an int, the name nvidia-smi gives, and each sample as
JSON-serialisable as the bench writes it. With CT200_GPU_OUT=DIR the samples are kept in
DIR/telemetry.json.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ct200_tools.bench.telemetry import Telemetry, around
from tests.gpu import nvsmi

pytestmark = pytest.mark.gpu

#: Seconds of matmuls between the samples: long enough for the clocks to leave idle.
WORK_S = 4.0


def check_sample(sample: dict[str, object], smi_name: str) -> dict[str, Any]:
    assert sample["available"] is True, sample
    gpus = sample["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 1, sample
    g: dict[str, Any] = gpus[0]
    assert "unread" not in g and "error" not in g, g
    assert g["index"] == 0
    assert isinstance(g["name"], str) and g["name"] == smi_name, (g["name"], smi_name)
    assert isinstance(g["sm_clock_mhz"], int) and g["sm_clock_mhz"] > 0, g
    assert isinstance(g["mem_clock_mhz"], int) and g["mem_clock_mhz"] > 0, g
    assert isinstance(g["temperature_c"], int) and 5 <= g["temperature_c"] <= 100, g
    assert isinstance(g["power_w"], float) and 0 < g["power_w"] < 2000, g
    mask = g["clocks_event_reasons"]
    assert isinstance(mask, int) and not isinstance(mask, bool) and mask >= 0, g
    assert isinstance(g["reasons"], list) and isinstance(g["throttle"], list), g
    # As the bench writes it: JSON, exact values back.
    assert json.loads(json.dumps(sample)) == sample
    return g


def test_real_nvml_around_real_cuda_work() -> None:
    torch = pytest.importorskip("torch", reason="the CUDA work is torch matmuls")
    assert torch.cuda.is_available(), "torch sees no CUDA device on a machine with a GPU"
    smi_name = nvsmi.query_gpus()[0]["name"]
    telemetry = Telemetry([0])  # the real pynvml: no stand-in passed
    assert telemetry.ready, telemetry.reason
    try:
        before = telemetry.sample()
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        start = time.monotonic()
        matmuls = 0
        during: dict[str, object] = {}
        while time.monotonic() - start < WORK_S:
            for _ in range(50):
                c = a @ b
            matmuls += 50
            if not during and time.monotonic() - start > WORK_S / 2:
                during = telemetry.sample()  # the queue is full: the GPU is busy now
            torch.cuda.synchronize()
        work_s = time.monotonic() - start
        assert during, "no sample was taken while the matmuls ran"
        assert float(c[0, 0].float().isfinite()) == 1.0
        after = telemetry.sample()
    finally:
        telemetry.close()
    assert not telemetry.ready
    samples = {"before": before, "during": during, "after": after}
    got = {k: check_sample(v, smi_name) for k, v in samples.items()}
    point = around(before, after)
    assert json.loads(json.dumps(point)) == point
    assert isinstance(point["throttled"], list)
    assert all(isinstance(t, str) and t.startswith("GPU0: ") for t in point["throttled"])
    # The power cap is recorded apart from throttling (a busy H200 sits at its power limit).
    assert point["power_capped"] in ([], ["GPU0"]), point
    assert not any("power cap" in t for t in point["throttled"]), point
    # Under load the board draws more than at idle (clocks may go either way: a power cap).
    assert got["during"]["power_w"] > got["before"]["power_w"], got
    tflops = 2 * 8192**3 * matmuls / work_s / 1e12
    keep = os.environ.get("CT200_GPU_OUT")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        record = {**samples, "around": point, "matmuls": matmuls, "work_s": round(work_s, 2)}
        record["bf16_tflops"] = round(tflops, 1)
        Path(keep, "telemetry.json").write_text(json.dumps(record, indent=1))
