"""GPU telemetry per point through the NVML stand-in that replays the recorded H200."""

from __future__ import annotations

import dataclasses

from ct200_tools.bench import telemetry
from tests.unit import nvml_standin
from tests.unit.nvml_standin import NVML_ERROR_NOT_SUPPORTED


def test_the_recorded_h200_at_idle() -> None:
    nvml = nvml_standin.h200()
    t = telemetry.Telemetry([0], nvml)
    sample = t.sample()
    t.close()
    assert sample == {
        "available": True,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "sm_clock_mhz": 345,
                "mem_clock_mhz": 3201,
                "temperature_c": 33,
                "power_w": 80.46,
                "clocks_event_reasons": 1,
                "reasons": ["GPU idle"],
                "throttle": [],
            }
        ],
    }
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert telemetry.around(sample, sample)["throttled"] == []


def test_thermal_throttling_is_flagged_and_the_power_cap_recorded_apart() -> None:
    hot = dataclasses.replace(nvml_standin.H200_GPU, clocks_event_reasons=0x4 | 0x40)
    t = telemetry.Telemetry([0], nvml_standin.NvmlStandin(gpus=(hot,)))
    cool = telemetry.Telemetry([0], nvml_standin.h200())
    point = telemetry.around(cool.sample(), t.sample())
    assert point["throttled"] == ["GPU0: HW thermal slowdown"]
    assert point["power_capped"] == ["GPU0"]


def test_a_gpu_at_its_power_limit_alone_is_not_throttled() -> None:
    """What the real H200 reports under load (docs/benchmarks.md): SW power cap, 0x4, only."""
    busy = dataclasses.replace(nvml_standin.H200_GPU, clocks_event_reasons=0x4)
    t = telemetry.Telemetry([0], nvml_standin.NvmlStandin(gpus=(busy,)))
    sample = t.sample()
    point = telemetry.around(sample, sample)
    assert point["throttled"] == [] and point["power_capped"] == ["GPU0"]
    assert sample["gpus"][0]["reasons"] == ["SW power cap"]  # type: ignore[index]


def test_no_driver_is_unavailable_with_the_reason() -> None:
    t = telemetry.Telemetry([0], nvml_standin.no_driver())
    assert t.sample() == {
        "available": False,
        "reason": "nvmlInit failed: NVML Shared Library Not Found",
    }


def test_a_refused_field_is_null_with_its_reason_never_guessed() -> None:
    nvml = nvml_standin.NvmlStandin(failing={"nvmlDeviceGetPowerUsage": NVML_ERROR_NOT_SUPPORTED})
    (gpu,) = telemetry.Telemetry([0], nvml).sample()["gpus"]  # type: ignore[misc]
    assert gpu["power_w"] is None
    assert gpu["unread"] == {"power_w": "Not Supported"}
    assert gpu["sm_clock_mhz"] == 345


def test_a_server_without_gpus_has_no_telemetry() -> None:
    nvml = nvml_standin.h200()
    assert telemetry.Telemetry([], nvml).sample() == {
        "available": False,
        "reason": "the server has no GPUs",
    }
    assert nvml.calls == []
