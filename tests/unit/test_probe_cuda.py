"""probes/cuda.py: the cuInit child's output, parsed as the recorded fixtures hold it."""

from __future__ import annotations

import pytest

from ct200_tools.doctor.probes.cuda import parse_child_output
from ct200_tools.facts import CudaFacts
from tests.unit.probe_helpers import (
    facts,
)


def test_parse_child_output_ok_reproduces_healthy_fixture() -> None:
    want = facts("h200-healthy").cuda
    assert want is not None and want.duration_s is not None
    out = '{"code": 0, "name": "CUDA_SUCCESS", "driver_version": 13000, "device_count": 1}\n'
    assert parse_child_output(out, "", 0, want.duration_s) == want


@pytest.mark.parametrize("fixture", ["h200-uvm-denied", "h200-uvm-stale"])
def test_parse_child_output_code_without_name(fixture: str) -> None:
    """cuGetErrorName can fail too: the name then comes from the code (999 as recorded)."""
    want = facts(fixture).cuda
    assert want is not None and want.duration_s is not None
    got = parse_child_output('{"code": 999, "driver_version": 13000}\n', "", 0, want.duration_s)
    assert got == want
    assert got.name == "CUDA_ERROR_UNKNOWN"


def test_parse_child_output_error_reproduces_nodriver_fixture() -> None:
    want = facts("nodriver-vm").cuda
    assert want is not None and want.error is not None and want.duration_s is not None
    out = '{"error": "' + want.error + '"}\n'
    assert parse_child_output(out, "", 0, want.duration_s) == want
    assert "libcuda.so.1" in want.error


def test_parse_child_output_last_line_counts() -> None:
    """Whatever a library prints before the child's JSON line is ignored."""
    out = 'NVIDIA: warning from the driver\n{"code": 0, "name": "CUDA_SUCCESS"}\n'
    assert parse_child_output(out, "", 0, 0.1) == CudaFacts(
        code=0, name="CUDA_SUCCESS", duration_s=0.1
    )


def test_parse_child_output_garbage_uses_stderr() -> None:
    err = "Traceback (most recent call last):\n  File ...\nOSError: boom\n"
    got = parse_child_output("not json at all\n", err, 1, 0.2)
    assert got == CudaFacts(duration_s=0.2, error="cuInit child exited 1: OSError: boom")


def test_parse_child_output_nothing_at_all() -> None:
    """A child killed by a signal inside cuInit (SIGSEGV) prints nothing."""
    got = parse_child_output("", "", -11, 0.3)
    assert got == CudaFacts(duration_s=0.3, error="cuInit child exited -11: no output")


@pytest.mark.parametrize("last_line", ["0", "null", "[1]", '"done"'])
def test_parse_child_output_json_that_is_not_an_object(last_line: str) -> None:
    got = parse_child_output(f"{last_line}\n", "", 0, 0.1)
    assert got.code is None and got.error is not None
