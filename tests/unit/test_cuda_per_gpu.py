"""Per-GPU CUDA init: how the GPUs are listed, the real child script run against a libcuda
stand-in, the facts it leaves, and gpu.cuda_init's verdict on them.

No GPU here: the children run for real (processes, environment, deadlines) against
tests/unit/libcuda_standin.c, a STAND-IN for libcuda.so.1 built into a temp dir and put first on
LD_LIBRARY_PATH, over a /proc/driver/nvidia/gpus tree written in the driver's format. The
verdicts are judged on per-GPU facts derived from the recordings (tests/fixtures/derive_per_gpu).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ct200_tools.doctor.probes as probes_pkg
from ct200_tools.doctor import warmup
from ct200_tools.doctor.checks import run_checks
from ct200_tools.doctor.probes import collect
from ct200_tools.doctor.probes.base import Reader
from ct200_tools.doctor.probes.cuda import normal_bus, summarise
from ct200_tools.facts import CudaGpuInit, Facts, loads
from ct200_tools.spec import SiteSpec, load_spec
from tests.fixtures import derive_per_gpu

ROOT = Path(__file__).parents[2]
FACTS = ROOT / "tests" / "fixtures" / "facts"
STANDIN_C = Path(__file__).with_name("libcuda_standin.c")
#: The recorded H200's UUID and bus, then made-up ones for GPUs that were not there.
GPUS = {
    "GPU-a61bc79c-dda9-716d-3636-4b8e10cf1584": "0000:00:06.0",
    "GPU-00000000-0000-0000-0000-000000000001": "0000:00:07.0",
    "GPU-00000000-0000-0000-0000-0000000000a1": "0000:a1:00.0",
}
UUIDS = list(GPUS)


@pytest.fixture(autouse=True)
def no_prestart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "_prestarted", None)
    monkeypatch.setattr(probes_pkg, "PROBES", ())  # the CUDA probe alone
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the libcuda stand-in")
    out = tmp_path_factory.mktemp("libcuda")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"), str(STANDIN_C)],
        check=True,
    )
    return out


@pytest.fixture
def driver(standin: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The stand-in first on the children's library path, with the three GPUs above."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(standin))
    monkeypatch.setenv("CT200_STANDIN_GPUS", ",".join(f"{u}={b}" for u, b in GPUS.items()))
    yield monkeypatch


def information(uuid: str | None, minor: int, bus: str, excluded: bool = False) -> str:
    """/proc/driver/nvidia/gpus/<bus>/information as nv-procfs.c writes it (tabs included)."""
    lines = ["Model: \t\t NVIDIA H200", "IRQ:   \t\t 0"]
    if uuid is not None:
        lines.append(f"GPU UUID: \t {uuid}")
    lines += [
        "Video BIOS: \t 96.00.af.00.01",
        "Bus Type: \t PCIe",
        f"Bus Location: \t {bus}",
        f"Device Minor: \t {minor}",
        f"GPU Excluded:\t {'Yes' if excluded else 'No'}",
    ]
    return "\n".join(lines) + "\n"


def proc_tree(root: Path, gpus: dict[str, str], **overrides: str) -> Path:
    """A root whose /proc/driver/nvidia/gpus lists these GPUs (minors in bus order); an
    override replaces one bus's information text."""
    for minor, (uuid, bus) in enumerate(sorted(gpus.items(), key=lambda kv: kv[1])):
        d = root / "proc/driver/nvidia/gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(overrides.get(bus, information(uuid, minor, bus)))
    return root


def probe(root: Path, timeout_s: float = 30.0, mode: str = "per-gpu") -> Facts:
    return collect(reader=Reader(root=root), timeout_s=timeout_s, cuda_mode=mode)


# -- listing and options -----------------------------------------------------------------------
def test_gpus_listed_in_pci_bus_order(tmp_path: Path) -> None:
    """CUDA and NVML count in bus order; a 5-digit (VMD) domain sorts after 0000, not by text."""
    buses = ["0000:a1:00.0", "10000:01:00.0", "0000:00:07.0", "0000:21:00.0"]
    for b in buses:
        (tmp_path / "proc/driver/nvidia/gpus" / b).mkdir(parents=True)
    assert warmup.list_gpus(str(tmp_path)) == [
        "0000:00:07.0",
        "0000:21:00.0",
        "0000:a1:00.0",
        "10000:01:00.0",
    ]
    with pytest.raises(OSError):
        warmup.list_gpus(str(tmp_path / "nothing"))


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        (["check"], "per-gpu"),
        (["check", "--cuda-init", "all"], "all"),
        (["snapshot", "--cuda-init=per-gpu"], "per-gpu"),
        (["check", "--cuda-init", "both"], None),
        (["check", "--cuda-init"], None),
    ],
)
def test_the_prestart_reads_the_mode_as_the_cli_will(argv: list[str], mode: str | None) -> None:
    assert warmup.cuda_mode(argv) == mode


def test_callers_cuda_visible_devices_entries() -> None:
    assert warmup.visible_entries({}) is None
    assert warmup.visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert warmup.visible_entries({"CUDA_VISIBLE_DEVICES": "2, 3,GPU-ab"}) == ["2", "3", "GPU-ab"]


def test_normal_bus() -> None:
    assert normal_bus("0000:A1:00.0") == "0000:a1:00.0"
    assert normal_bus("00000000:A1:00.0") == "0000:a1:00.0"
    assert normal_bus("") is None


# -- the real children against the stand-in ----------------------------------------------------
def test_one_child_per_gpu_each_names_its_gpu(tmp_path: Path, driver: pytest.MonkeyPatch) -> None:
    f = probe(proc_tree(tmp_path, GPUS))
    c = f.cuda
    assert c is not None and c.mode == "per-gpu" and c.note is None
    assert [g.index for g in c.gpus] == [0, 1, 2]
    assert [g.pci_bus_id for g in c.gpus] == sorted(GPUS.values())
    # Each child saw its GPU alone, by UUID, and CUDA opened that GPU (upper-case bus, normalised).
    assert [g.visible for g in c.gpus] == UUIDS
    assert [g.cuda_bus_id for g in c.gpus] == [g.pci_bus_id for g in c.gpus]
    assert [g.minor for g in c.gpus] == [0, 1, 2]
    assert all(g.code == 0 and g.name == "CUDA_SUCCESS" and g.step is None for g in c.gpus)
    assert all(g.cuinit_s is not None and g.context_s is not None for g in c.gpus)
    assert (c.code, c.name, c.device_count, c.driver_version) == (0, "CUDA_SUCCESS", 3, 13000)
    assert f.probes[0].name == "cuda" and f.probes[0].outcome == "ok"


def test_a_failing_and_a_hung_gpu_are_each_named(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    """One GPU's cuInit fails, another's never returns: each is recorded as itself, and the
    hung one is cut off at its deadline while the others' results stand."""
    driver.setenv("CT200_STANDIN_FAIL", f"{UUIDS[1]}=999")
    driver.setenv("CT200_STANDIN_HANG", UUIDS[2])
    f = probe(proc_tree(tmp_path, GPUS), timeout_s=3)
    c = f.cuda
    assert c is not None
    ok, lost, hung = c.gpus
    assert ok.code == 0
    assert (lost.code, lost.name, lost.step, lost.cuda_bus_id) == (
        999,
        "CUDA_ERROR_UNKNOWN",
        "cuInit",
        None,
    )
    assert lost.pci_bus_id == "0000:00:07.0" and not lost.timed_out
    assert hung.timed_out and hung.code is None and hung.pci_bus_id == "0000:a1:00.0"
    assert hung.error == "CUDA did not finish within 3 s (driver hung?)"
    assert (c.code, c.device_count, c.timed_out) == (999, 1, False)


def test_every_gpu_hung_is_the_probe_timing_out(tmp_path: Path, driver: pytest.MonkeyPatch) -> None:
    one = {UUIDS[0]: GPUS[UUIDS[0]]}
    driver.setenv("CT200_STANDIN_GPUS", f"{UUIDS[0]}={GPUS[UUIDS[0]]}")
    driver.setenv("CT200_STANDIN_HANG", UUIDS[0])
    f = probe(proc_tree(tmp_path, one), timeout_s=1)
    assert f.cuda is not None and f.cuda.timed_out and f.cuda.code is None
    assert f.cuda.error == "GPU0 0000:00:06.0: CUDA did not finish within 1 s (driver hung?)"
    assert f.probes[0].outcome == "timeout"


def test_no_uuid_falls_back_to_the_place_in_bus_order(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    """A driver that shows no UUID: the child uses its index, in PCI bus order, and reports
    the GPU CUDA opened, which is the one meant."""
    bus = GPUS[UUIDS[1]]
    root = proc_tree(tmp_path, GPUS, **{bus: information(None, 1, bus)})
    c = probe(root).cuda
    assert c is not None
    g = c.gpus[1]
    assert g.visible == "1" and g.cuda_bus_id == bus and g.code == 0


def test_an_excluded_gpu_says_so_without_cuda(tmp_path: Path, driver: pytest.MonkeyPatch) -> None:
    bus = GPUS[UUIDS[2]]
    root = proc_tree(tmp_path, GPUS, **{bus: information(UUIDS[2], 2, bus, excluded=True)})
    c = probe(root).cuda
    assert c is not None
    g = c.gpus[2]
    assert g.code is None and g.error == "the driver excludes this GPU (NVreg_ExcludedGpus)"
    assert g.minor == 2 and c.device_count == 2


def test_the_callers_cuda_visible_devices_gives_one_child_per_entry(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    """A start gate sets the server's GPUs: the doctor judges exactly those, each alone."""
    driver.setenv("CUDA_VISIBLE_DEVICES", f"2,{UUIDS[0]}")
    c = probe(proc_tree(tmp_path, GPUS)).cuda
    assert c is not None
    assert [(g.index, g.visible, g.pci_bus_id) for g in c.gpus] == [
        (2, "2", "0000:a1:00.0"),
        (None, UUIDS[0], "0000:00:06.0"),
    ]
    assert c.device_count == 2


def test_a_servers_gpus_only(tmp_path: Path, driver: pytest.MonkeyPatch) -> None:
    """collect(cuda_gpus=...) (a server's start gate): children for those GPUs alone, by UUID;
    an index the driver does not list goes to CUDA by index, which says there is no such GPU.
    The caller's own CUDA_VISIBLE_DEVICES does not widen it."""
    driver.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    root = proc_tree(tmp_path, GPUS)
    c = collect(reader=Reader(root=root), timeout_s=30, cuda_gpus=[2, 0, 7]).cuda
    assert c is not None and c.mode == "per-gpu"
    assert [(g.index, g.visible, g.pci_bus_id, g.code) for g in c.gpus] == [
        (2, UUIDS[2], "0000:a1:00.0", 0),
        (0, UUIDS[0], "0000:00:06.0", 0),
        (7, "7", None, 100),
    ]
    whole = collect(reader=Reader(root=root), cuda_gpus=[1], cuda_mode="all").cuda
    assert whole is not None and (whole.code, whole.device_count) == (0, 1)


def test_an_empty_cuda_visible_devices_runs_the_all_gpu_child(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    driver.setenv("CUDA_VISIBLE_DEVICES", "")
    c = probe(proc_tree(tmp_path, GPUS)).cuda
    assert c is not None and c.mode == "all" and not c.gpus
    assert c.note == "CUDA_VISIBLE_DEVICES is empty: it hides every GPU"
    assert (c.code, c.name) == (100, "CUDA_ERROR_NO_DEVICE")


def test_without_the_module_per_gpu_runs_the_all_gpu_child(tmp_path: Path) -> None:
    """No /proc/driver/nvidia (this machine): the one child of before, which says why."""
    c = probe(tmp_path).cuda
    assert c is not None and c.mode == "all" and not c.gpus
    assert c.note is not None and c.note.startswith("cannot list /proc/driver/nvidia/gpus")
    assert c.error is not None and c.error.startswith("libcuda.so.1 not found")


def test_without_the_drivers_procfs_one_child_per_gpu_node(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    """/dev/nvidiaN nodes but no /proc/driver/nvidia (a sandbox passing the nodes only): one
    child per node, by index in bus order, each reporting the GPU CUDA opened."""
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).write_text("")
    c = probe(tmp_path).cuda
    assert c is not None and c.mode == "per-gpu"
    assert c.note is not None and "one child per /dev/nvidiaN node (2)" in c.note
    assert [(g.index, g.visible, g.pci_bus_id, g.code) for g in c.gpus] == [
        (0, "0", "0000:00:06.0", 0),
        (1, "1", "0000:00:07.0", 0),
    ]


def test_all_mode_is_one_cuinit_over_every_gpu(tmp_path: Path, driver: pytest.MonkeyPatch) -> None:
    c = probe(proc_tree(tmp_path, GPUS), mode="all").cuda
    assert c is not None and c.mode == "all" and not c.gpus and c.note is None
    assert (c.code, c.device_count, c.driver_version) == (0, 3, 13000)


def test_a_prestarted_mode_that_was_not_asked_for_is_not_used(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    root = proc_tree(tmp_path, GPUS)
    first = warmup.spawn("all", str(root))
    warmup._prestarted = first
    c = probe(root).cuda
    assert c is not None and c.mode == "per-gpu" and len(c.gpus) == 3
    assert all(ch.proc.returncode is not None for ch in first.children)  # reaped


def test_garbage_from_a_child_is_reported_not_trusted(
    tmp_path: Path, driver: pytest.MonkeyPatch
) -> None:
    driver.setattr(warmup, "PER_GPU_CHILD", "import sys; print('not json'); sys.exit(3)")
    c = probe(proc_tree(tmp_path, GPUS)).cuda
    assert c is not None
    assert {g.error for g in c.gpus} == {"CUDA child exited 3: not json"}
    assert c.code is None and c.device_count is None
    assert c.error == "GPU0 0000:00:06.0: CUDA child exited 3: not json"


def test_the_child_script_runs_without_site_or_user_paths() -> None:
    """python -I -S, as the children run: the script needs nothing but the stdlib."""
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-c", warmup.PER_GPU_CHILD, "", "", "/"],
        capture_output=True,
        text=True,
        check=False,
        env={"CUDA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": "/nonexistent"},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('{"visible": "0", "error": "libcuda.so.1 not found: ')


def test_summarise() -> None:
    ok = CudaGpuInit(index=0, pci_bus_id="0000:01:00.0", code=0, name="CUDA_SUCCESS")
    bad = CudaGpuInit(index=1, pci_bus_id="0000:21:00.0", code=999, name="CUDA_ERROR_UNKNOWN")
    c = summarise((ok, bad), 13000)
    assert (c.code, c.name, c.device_count, c.driver_version, c.error) == (
        999,
        "CUDA_ERROR_UNKNOWN",
        1,
        13000,
        None,
    )
    assert c.failing == (bad,)


# -- verdicts on the derived per-GPU facts -----------------------------------------------------
SPECS = {
    "ct200": ROOT / "inventory" / "ct200",
    "h200": ROOT / "benchmarks" / "doctor" / "h200-site.yml",
    "h200x2": ROOT / "benchmarks" / "doctor" / "h200x2-site.yml",
}


@functools.cache
def spec(name: str) -> SiteSpec:
    return load_spec(SPECS[name])


def judged(name: str, site: str) -> dict[str, object]:
    f = loads((FACTS / f"{name}.json").read_text())
    return {x.id: x for x in run_checks(f, spec(site))}


def test_per_gpu_fixtures_are_current() -> None:
    for name, f in derive_per_gpu.derived().items():
        assert loads((FACTS / name).read_text()) == f, f"regenerate {name}"


def test_healthy_per_gpu_names_every_gpu() -> None:
    got = judged("pergpu-ct200-ct-healthy", "ct200")
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "pass"  # type: ignore[attr-defined]
    assert cuda.summary == (  # type: ignore[attr-defined]
        "a CUDA context on each of 8 GPUs (one child per GPU) in 0.35 s"
    )
    assert cuda.evidence[3] == "GPU3 0000:61:00.0: context ok"  # type: ignore[attr-defined]
    assert got["gpu.count"].status == "pass"  # type: ignore[attr-defined]


def test_a_fallen_off_gpu_is_named_with_a_host_side_fix() -> None:
    got = judged("pergpu-ct200-ct-gpu-lost", "ct200")
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail" and cuda.caused_by is None  # type: ignore[attr-defined]
    assert cuda.summary == (  # type: ignore[attr-defined]
        "GPU3 0000:61:00.0: cuInit returned 999 CUDA_ERROR_UNKNOWN, while 7 other GPUs "
        "started; /dev/nvidia3 opens fine, so the GPU itself (or the driver's state of it) is "
        "at fault"
    )
    fix = cuda.remediation  # type: ignore[attr-defined]
    assert fix.where == "host"
    assert fix.command == "dmesg -T | grep -E 'NVRM|Xid'"
    assert "Xid 79: fallen off the bus" in fix.action
    assert "nvidia-smi -r -i 0000:61:00.0" in fix.action
    assert "reseat" in fix.action
    # CUDA counting 7 of 8 is that GPU, not a passthrough fault of its own.
    count = got["gpu.count"]
    assert count.status == "fail" and count.caused_by == "gpu.cuda_init"  # type: ignore[attr-defined]
    assert count.remediation == fix  # type: ignore[attr-defined]
    for cid in ("dev.nodes", "dev.majors", "dev.open", "driver.nvml"):
        assert got[cid].status == "pass", cid  # type: ignore[attr-defined]


def test_a_hung_gpu_is_named() -> None:
    got = judged("pergpu-ct200-ct-gpu-hung", "ct200")
    cuda = got["gpu.cuda_init"]
    assert cuda.status == "fail"  # type: ignore[attr-defined]
    assert cuda.summary.startswith(  # type: ignore[attr-defined]
        "GPU5 0000:a1:00.0: CUDA did not finish within 10 s (driver hung?), while 7 other GPUs"
    )
    assert "nvidia-smi -r -i 0000:a1:00.0" in cuda.remediation.action  # type: ignore[attr-defined]


def test_a_gpu_whose_node_is_missing_is_that_node() -> None:
    got = judged("pergpu-ct200-ct-gpu-node-missing", "ct200")
    cuda = got["gpu.cuda_init"]
    assert cuda.summary == (  # type: ignore[attr-defined]
        "GPU3 0000:61:00.0: cuInit returned 100 CUDA_ERROR_NO_DEVICE: /dev/nvidia3 does not exist"
    )
    assert cuda.caused_by == "dev.nodes"  # type: ignore[attr-defined]
    assert cuda.remediation == got["dev.nodes"].remediation  # type: ignore[attr-defined]
    assert "dev3: /dev/nvidia3,mode=0666" in cuda.remediation.config  # type: ignore[attr-defined]


def test_the_prestart_starts_cuda_before_the_doctor_is_imported() -> None:
    """The console entry's first step: children started, and nothing of the doctor's own but
    the stdlib-only warmup imported yet (its imports are what the children run beside)."""
    code = (
        "import json, sys; from ct200_tools.doctor import warmup; warmup.start(sys.argv[1:]); "
        "s = warmup._prestarted; "
        "print(json.dumps([s.asked, len(s.children), "
        "sorted(m for m in sys.modules if m.startswith('ct200_tools'))]))"
    )
    for argv, asked in ((["check"], "per-gpu"), (["snapshot", "--cuda-init", "all"], "all")):
        r = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            timeout=60,
        )
        # the packages above it are docstrings only
        loaded = ["ct200_tools", "ct200_tools.doctor", "ct200_tools.doctor.warmup"]
        assert json.loads(r.stdout) == [asked, 1, loaded]
