"""The servers' probes on real things: recorded `systemctl show`, real listening sockets and the
processes that hold them, real HTTP servers (one that trickles its answer), real venvs whose
interpreter reads stand-in engine distributions made from recorded wheel metadata, and real
processes' environments. Plus the version arithmetic of compressed-tensors formats.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ct200_tools.doctor.checks import quant
from ct200_tools.doctor.checks.base import Context
from ct200_tools.doctor.checks.server import JUDGES
from ct200_tools.doctor.probes.base import Ran, Reader
from ct200_tools.doctor.probes.engine import probe_engine, probe_quant
from ct200_tools.doctor.probes.ports import clashes, parse_listeners, probe_port, unit_of
from ct200_tools.doctor.probes.servers import (
    _process_gpus,
    chosen,
    nvml_processes,
    visible_devices,
)
from ct200_tools.doctor.probes.serving import probe_serving
from ct200_tools.doctor.probes.systemd import parse_show, probe_units
from ct200_tools.facts import Facts, ServerFacts, ServingFacts, UnitFacts
from ct200_tools.httpclient import HttpTimeout
from ct200_tools.serve import engines
from ct200_tools.serve.serving import KIND, ServingState
from ct200_tools.spec import ModelSpec, ServerSpec, SiteSpec, load_spec
from tests.unit import server_facts as sf

FIX = Path(__file__).parents[1] / "fixtures"
ENGINES = FIX / "raw" / "engines"


# --- systemd ------------------------------------------------------------------------------------


def test_parse_show_reads_every_recorded_unit() -> None:
    units = list(sf.RECORDED_UNITS.values())
    got = parse_show(sf.show_text(), units)
    assert set(got) == set(units)
    ok = got["ct200-server-rec-ok.service"]
    assert (ok.load_state, ok.active_state, ok.sub_state, ok.result) == (
        "loaded",
        "active",
        "running",
        "success",
    )
    assert ok.main_pid == 57 and ok.control_group == "/system.slice/ct200-server-rec-ok.service"
    fail = got["ct200-server-rec-fail.service"]
    assert (fail.active_state, fail.result, fail.exec_main_status, fail.main_pid) == (
        "failed",
        "exit-code",
        2,
        0,
    )
    assert fail.control_group is None
    assert got["ct200-server-rec-limit.service"].n_restarts == 3
    assert got["ct200-server-rec-start.service"].active_state == "activating"
    assert got["ct200-server-rec-start.service"].sub_state == "start"
    assert got["ct200-server-rec-none.service"].load_state == "not-found"
    dead = got["ct200-server-rec-dead.service"]
    assert (dead.load_state, dead.active_state, dead.sub_state) == ("loaded", "inactive", "dead")


class Replay(Reader):
    """A Reader whose commands answer as recorded (the only thing replayed: files are real)."""

    def __init__(self, returncode: int, stdout: str = "", stderr: str = "") -> None:
        super().__init__()
        self.answer = (returncode, stdout, stderr)
        self.argvs: list[list[str]] = []

    def run(self, argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        self.argvs.append(argv)
        return Ran(*self.answer)


def test_probe_units_without_systemd_says_why() -> None:
    stderr = (FIX / "raw" / "systemd" / "show-without-systemd.stderr").read_text()
    r = Replay(1, "", stderr)
    assert probe_units(r, ["ct200-server-x.service"], "servers.units") == {}
    assert r.unreadable["servers.units"] == (
        "systemctl show: System has not been booted with systemd as init system (PID 1). "
        "Can't operate."
    )
    assert r.argvs[0][:3] == ["systemctl", "show", "--no-pager"]
    assert r.argvs[0][-1] == "ct200-server-x.service"


class Journal(Replay):
    """systemctl show answers as recorded; journalctl with an engine's last words."""

    LINES = "main: loading model\nerror: invalid argument: --no-such-flag\n"

    def run(self, argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        self.argvs.append(argv)
        return Ran(0, self.LINES, "") if argv[0] == "journalctl" else Ran(*self.answer)


def test_probe_units_passes_recorded_output_through() -> None:
    """As parsed, and a unit that exited (failed, or in its restart delay) with its last journal
    lines of this boot (issue 33: the crash is the root cause, with the engine's words)."""
    units = list(sf.RECORDED_UNITS.values())
    r = Journal(0, sf.show_text())
    got = probe_units(r, units, "servers.units")
    parsed = parse_show(sf.show_text(), units)
    asked = {a[-1].removeprefix("--unit=") for a in r.argvs if a[0] == "journalctl"}
    for name, unit in parsed.items():
        down = unit.active_state == "failed" or unit.sub_state == "auto-restart"
        lines = tuple(Journal.LINES.splitlines()) if down else ()
        assert got[name] == dataclasses.replace(unit, journal_tail=lines), name
        assert (name in asked) == down
    assert asked, "the recorded units include a failed one"


def test_probe_units_hung_systemctl_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real program that never answers, in systemctl's place on PATH: the probe returns at
    its deadline and says so."""
    from ct200_tools.doctor.probes import systemd  # noqa: PLC0415

    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nexec sleep 3600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(systemd, "SHOW_TIMEOUT_S", 0.3)
    r = Reader()
    assert probe_units(r, ["a.service"], "servers.units") == {}
    assert r.unreadable["servers.units"] == "systemctl show: systemctl did not finish within 0.3 s"


def test_unit_of_reads_v2_and_v1_lines() -> None:
    assert unit_of("0::/system.slice/ct200-server-qwen.service\n") == ("ct200-server-qwen.service")
    assert unit_of("0::/user.slice/user-0.slice/session-3.scope\n") == "session-3.scope"
    assert unit_of("0::/\n") is None
    v1 = "12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/sshd.service\n"
    assert unit_of(v1) == "sshd.service"


# --- ports ---------------------------------------------------------------------------------------


def _listen(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen()
    return s


def test_own_listening_socket_is_found_with_this_process() -> None:
    with _listen() as s:
        port = s.getsockname()[1]
        got = probe_port(Reader(), "127.0.0.1", port)
    assert len(got) == 1
    h = got[0]
    assert h.address == f"127.0.0.1:{port}"
    assert h.pid == os.getpid()
    assert h.name == Path("/proc/self/comm").read_text().strip()
    assert h.unit == unit_of(Path("/proc/self/cgroup").read_text())


@pytest.fixture
def other_listener() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Another process listening on every IPv4 address (as a stray server would)."""
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.bind(('0.0.0.0',0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield proc, port
    proc.kill()
    proc.wait()


def test_another_process_on_the_wildcard_is_named(
    other_listener: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = other_listener
    got = probe_port(Reader(), "127.0.0.1", port)
    assert [(h.address, h.pid) for h in got] == [(f"0.0.0.0:{port}", proc.pid)]
    assert got[0].name == Path(f"/proc/{proc.pid}/comm").read_text().strip()
    # A server bound to another address is not kept from binding by a listener on ::1 only,
    # but is by the wildcard (the holder above covers 127.0.0.2 too).
    assert probe_port(Reader(), "127.0.0.2", port)[0].pid == proc.pid


def test_free_port_and_other_address() -> None:
    with _listen() as s:
        port = s.getsockname()[1]
        assert probe_port(Reader(), "127.0.0.2", port) == ()
    assert probe_port(Reader(), "127.0.0.1", port) == ()


def test_ipv6_listener_is_read() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        s = _listen("::1", socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here: {exc}")
    with s:
        port = s.getsockname()[1]
        got = probe_port(Reader(), "::1", port)
    assert [(h.address, h.pid) for h in got] == [(f"[::1]:{port}", os.getpid())]


def test_parse_listeners_skips_connections_and_bad_lines() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:4E20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0  "
        "      0 4242 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:4E20 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0  "
        "      0 4343 1 0000000000000000 20 4 30 10 -1\n"
        "   2: garbage\n"
    )
    assert parse_listeners(text) == [("127.0.0.1", 20000, 4242)]


@pytest.mark.parametrize(
    ("listener", "host", "clash"),
    [
        ("0.0.0.0", "127.0.0.1", True),  # noqa: S104 - addresses compared, nothing bound
        ("127.0.0.1", "0.0.0.0", True),  # noqa: S104
        ("::", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "10.0.0.1", False),
        ("::1", "127.0.0.1", False),
        ("10.0.0.1", "server.local", True),  # a name is not resolved: any address may be it
    ],
)
def test_clashes(listener: str, host: str, clash: bool) -> None:
    assert clashes(listener, host) is clash


# --- HTTP and connect ---------------------------------------------------------------------------


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        for _ in range(100):  # one byte every 50 ms: 5 s for the whole answer
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.05)

    def log_message(self, *args: object) -> None:
        pass


def test_request_is_cut_off_at_its_deadline_even_when_bytes_trickle() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models"
        with pytest.raises(HttpTimeout, match=r"no complete answer within 0\.3 s"):
            Reader().request("GET", url, None, 0.3)
    finally:
        server.shutdown()
        server.server_close()


def test_connect_refused_on_a_closed_port() -> None:
    with _listen() as s:
        port = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        Reader().connect("127.0.0.1", port, 1.0)


# --- engine environments: real venvs, stand-in distributions from recorded metadata ---------------


def _dist(site: Path, name: str, metadata: str, package: str | None = None) -> None:
    """A distribution as pip leaves it, for importlib.metadata: NAME-VERSION.dist-info/METADATA
    (the recorded header); with `package`, an empty importable package of that name. A
    stand-in for the real wheel, which needs torch and a GPU to run."""
    text = (ENGINES / metadata).read_text()
    version = next(
        line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version")
    )
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(text)
    if package:
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engine") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root


def _site(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


@pytest.fixture
def clean_venv(venv: Path) -> Iterator[Path]:
    site = _site(venv)
    before = set(site.iterdir())
    yield venv
    import shutil  # noqa: PLC0415

    for p in set(site.iterdir()) - before:
        shutil.rmtree(p)


def _sglang(venv: Path, **changes: object) -> ServerSpec:
    s = ServerSpec(
        name="kimi",
        engine="sglang",
        model="kimi-k2.6",
        gpus=(0, 1, 2, 3, 4, 5, 6, 7),
        port=30010,
        tp=8,
        env={"VIRTUAL_ENV": str(venv)},
    )
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


NVFP4_CONFIG = {
    # The shape of the quantization_config llm-compressor writes for NVFP4 models (as in
    # published compressed-tensors NVFP4 checkpoints); Kimi K2.6's in the incident.
    "architectures": ["DeepseekV3ForCausalLM"],
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "version": "0.12.2",
        "config_groups": {
            "group_0": {
                "format": "nvfp4-pack-quantized",
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "group_size": 16},
            }
        },
    },
}


def _judge(cid: str, spec: SiteSpec, server: ServerSpec, f: ServerFacts) -> tuple[bool | None, str]:
    facts = Facts(servers=(f,))
    v = JUDGES[cid](Context(facts, spec), server, f)
    return v.ok, v.summary


def _spec(server: ServerSpec, staged: str) -> SiteSpec:
    from ct200_tools.spec import GpuSpec  # noqa: PLC0415

    model = ModelSpec(server.model, "/tank/models/x", staged)
    return SiteSpec(GpuSpec(8, "RTX PRO 6000"), models=(model,), servers=(server,))


@pytest.mark.parametrize(
    ("ct", "ok", "says"),
    [
        (
            "compressed_tensors-0.18.0",
            True,
            "compressed-tensors 0.18.0 reads nvfp4-pack-quantized, as sglang requires (==0.18.0)",
        ),
        (
            "compressed_tensors-0.10.0",
            False,
            "sglang 0.5.23 requires compressed-tensors==0.18.0 but 0.10.0 is installed",
        ),
        (
            "compressed_tensors-0.9.4",
            False,
            "kimi-k2.6: compressed-tensors 0.9.4 cannot read nvfp4-pack-quantized "
            "(read from 0.10.0)",
        ),
    ],
)
def test_engine_environment_read_by_its_own_interpreter(
    clean_venv: Path, tmp_path: Path, ct: str, ok: bool, says: str
) -> None:
    site = _site(clean_venv)
    _dist(site, "sglang", "sglang-0.5.23.METADATA", package="sglang")
    _dist(site, "compressed_tensors", f"{ct}.METADATA")
    staged = tmp_path / "kimi-k2.6"
    staged.mkdir()
    (staged / "config.json").write_text(json.dumps(NVFP4_CONFIG))
    server = _sglang(clean_venv)
    e = probe_engine(Reader(), server)
    python = f"{clean_venv}/bin/python"
    assert (e.path, e.resolved, e.python, e.exists, e.executable) == (
        python,
        python,
        python,
        True,
        True,
    )
    assert (e.module, e.module_found, e.dist, e.dist_version) == (
        "sglang",
        True,
        "sglang",
        "0.5.23",
    )
    assert e.ct_requirement == "compressed-tensors==0.18.0"
    assert e.compressed_tensors == ct.split("-")[1]
    assert e.error is None
    q = probe_quant(Reader(), str(staged))
    assert (q.quant_method, q.format, q.group_formats) == (
        "compressed-tensors",
        "nvfp4-pack-quantized",
        ("nvfp4-pack-quantized",),
    )
    spec = _spec(server, str(staged))
    f = ServerFacts("kimi", engine=e, quant=q)
    assert _judge("server.engine", spec, server, f) == (
        True,
        f"sglang 0.5.23 installed for {python}",
    )
    got_ok, summary = _judge("server.quant", spec, server, f)
    assert got_ok is ok and summary.startswith(says), summary


def test_engine_not_installed_in_its_interpreter(clean_venv: Path) -> None:
    server = _sglang(clean_venv)
    e = probe_engine(Reader(), server)
    assert (e.module_found, e.dist_version, e.compressed_tensors) == (False, None, None)
    spec = _spec(server, "/dev/shm/models/kimi-k2.6")
    ok, summary = _judge("server.engine", spec, server, ServerFacts("kimi", engine=e))
    assert ok is False
    assert summary == f"sglang is not installed for {clean_venv}/bin/python"


def test_engine_venv_missing_names_the_path(tmp_path: Path) -> None:
    server = _sglang(tmp_path / "nowhere")
    e = probe_engine(Reader(), server)
    assert (e.exists, e.resolved) == (False, f"{tmp_path}/nowhere/bin/python")
    spec = _spec(server, "/dev/shm/models/kimi-k2.6")
    f = ServerFacts("kimi", engine=e)
    v = JUDGES["server.engine"](Context(Facts(servers=(f,)), spec), server, f)
    assert v.ok is False
    assert v.summary == f"interpreter {tmp_path}/nowhere/bin/python does not exist"
    assert v.remedy is not None
    assert v.remedy.command == (
        f"python3 -m venv {tmp_path}/nowhere && {tmp_path}/nowhere/bin/python -m pip install sglang"
    )


def test_command_on_path_and_missing(tmp_path: Path) -> None:
    base = ServerSpec("llama", "command", "tiny", (), 8080, 0, command=("sh", "-c", "true"))
    e = probe_engine(Reader(), base)
    assert e.resolved is not None and e.resolved.endswith("/sh") and e.executable
    assert e.python is None  # not a Python: no environment read
    gone = dataclasses.replace(base, command=("no-such-llama-server",))
    e = probe_engine(Reader(), gone)
    assert (e.resolved, e.exists) == (None, False)
    spec = _spec(gone, str(tmp_path))
    ok, summary = _judge("server.engine", spec, gone, ServerFacts("llama", engine=e))
    assert ok is False and summary.startswith("command 'no-such-llama-server' not found on PATH")


def test_engine_interpreter_that_fails_is_reported(tmp_path: Path) -> None:
    """A "python" that exits 1 (a broken venv): the probe says so, and server.engine fails."""
    bad = tmp_path / "bin" / "python3"
    bad.parent.mkdir()
    bad.write_text("#!/bin/sh\necho 'broken venv' >&2\nexit 1\n")
    bad.chmod(0o755)
    server = ServerSpec("x", "command", "m", (), 8080, 0, command=(str(bad), "-m", "server"))
    e = probe_engine(Reader(), server)
    assert e.python == str(bad)
    assert e.error == f"{bad} failed: broken venv"


def test_model_without_config_and_not_staged(tmp_path: Path) -> None:
    staged = tmp_path / "tiny"
    staged.mkdir()
    (staged / "tiny.gguf").write_bytes(b"GGUF")
    assert probe_quant(Reader(), str(staged)).exists is False
    q = probe_quant(Reader(), str(tmp_path / "gone"))
    assert q.exists and q.error is not None and "not there" in q.error
    (staged / "config.json").write_text("{not json")
    assert probe_quant(Reader(), str(staged)).error == f"{staged}/config.json is not JSON"


# --- processes' GPUs ------------------------------------------------------------------------------


def test_process_gpus_from_a_real_process_environment() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    code = "import sys; print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"  # exec'd: /proc/PID/environ is its own now
        unit = UnitFacts("ct200-server-x.service", active_state="active", main_pid=proc.pid)
        g = _process_gpus(Reader(), unit)
    finally:
        proc.kill()
        proc.wait()
    assert g.pids == (proc.pid,)
    assert g.visible == {str(proc.pid): "4,5,6,7"}


def test_visible_devices_unset_and_empty() -> None:
    assert visible_devices(b"A=1\0CUDA_VISIBLE_DEVICES=0,1\0") == "0,1"
    assert visible_devices(b"CUDA_VISIBLE_DEVICES=\0") == ""
    assert visible_devices(b"PATH=/bin\0") is None


class _NvmlRecorded:
    """NVML as the recorded H200 answered: one GPU, no compute process (nvidia-smi -q -x of
    tests/fixtures/raw/h200: <processes></processes>)."""

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        return []


def test_nvml_processes_on_the_recorded_idle_gpu_and_without_nvml() -> None:
    assert nvml_processes({1234}, _NvmlRecorded()) == ((), (), None)
    gpus, pids, why = nvml_processes({1234})  # the real pynvml on this machine
    if why is not None:
        assert gpus is None and pids == ()
        assert why.startswith("NVML unavailable")


# --- serving set, choice of servers, scope ------------------------------------------------------


def test_serving_file_absent_valid_and_broken(tmp_path: Path) -> None:
    r = Reader(root=tmp_path)
    assert probe_serving(r) == ServingFacts("/var/lib/ct200/serving.json")
    path = tmp_path / "var" / "lib" / "ct200" / "serving.json"
    path.parent.mkdir(parents=True)
    # The file as the switch writes it: the probe parses it with ct200_tools.serve.serving.
    path.write_text(ServingState(("kimi-tp8-eagle3",), "2026-12-01T00:00:00+00:00").to_json())
    assert probe_serving(r).servers == ("kimi-tp8-eagle3",)
    path.write_text("{")
    assert probe_serving(r).error == "not JSON"
    path.write_text(json.dumps({"kind": KIND, "schema_version": 1, "servers": "kimi"}))
    assert probe_serving(r).error == 'no "servers" list of names in it'


def test_the_serving_set_decides_which_servers_are_judged() -> None:
    ct200 = load_spec(FIX.parents[1] / "inventory" / "ct200")
    enabled = [s.name for s in chosen(ct200, None, None)]
    assert enabled == ["qwen-tp4-ddtree", "qwen-tp4-dflash"]
    kimi = ServingFacts("/var/lib/ct200/serving.json", True, ("kimi-tp8-eagle3",))
    assert [s.name for s in chosen(ct200, kimi, None)] == ["kimi-tp8-eagle3"]
    assert [s.name for s in chosen(ct200, kimi, "qwen-tp4-dflash")] == ["qwen-tp4-dflash"]
    ctx = Context(Facts(serving=kimi), ct200)
    assert [s.name for s in ctx.serving_servers()] == ["kimi-tp8-eagle3"]
    assert [m.name for m in ctx.needed_models()] == ["kimi-k2.6", "kimi-k2.6-eagle3"]
    absent = Context(Facts(serving=ServingFacts("/var/lib/ct200/serving.json")), ct200)
    assert [m.name for m in absent.needed_models()] == [m.name for m in ct200.needed_models()]


# --- compressed-tensors versions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.18.0", "==0.18.0", True),
        ("0.18.0.1", "==0.18.0", False),
        ("0.12.2", ">=0.10,<0.13", True),
        ("0.13.0", ">=0.10,<0.13", False),
        ("0.12.9", "==0.12.*", True),
        ("0.13.0", "==0.12.*", False),
        ("0.12.3", "~=0.12.0", True),
        ("0.13.0", "~=0.12.0", False),
        ("0.14.0.1", ">0.14.0", True),
        ("0.10.0rc1", ">=0.10.0", True),  # pre-releases read as their release: all we need
        ("0.10.0", "!=0.10.0", False),
    ],
)
def test_satisfies(version: str, spec: str, ok: bool) -> None:
    assert quant.satisfies(version, spec) is ok


def test_requirement_spec_and_unknown_specifiers() -> None:
    assert quant.requirement_spec("compressed-tensors==0.18.0") == "==0.18.0"
    assert quant.requirement_spec("compressed_tensors (>=0.10) ; extra == 'srt'") == ">=0.10"
    assert quant.satisfies("0.10.0", "@ file:///x") is None


def test_format_table_edges() -> None:
    assert quant.format_problem("nvfp4-pack-quantized", "0.9.4") is not None
    assert quant.format_problem("nvfp4-pack-quantized", "0.10.0") is None
    assert quant.format_problem("mxfp4-pack-quantized", "0.12.2") is not None
    assert quant.format_problem("mxfp4-pack-quantized", "0.13.0") is None
    assert quant.format_problem("marlin-24", "0.14.0.1") is None
    assert "dropped in 0.15.0" in (quant.format_problem("marlin-24", "0.15.0") or "")
    assert quant.format_problem("mixed-precision", "0.10.2") is not None
    assert not quant.format_known("nvfp8-future")
    assert quant.format_known("dense")


def test_served_name_and_unit_contract() -> None:
    base = ServerSpec("q", "sglang", "qwen3.6-27b", (0,), 30000, 1)
    assert engines.served_name(base) == "qwen3.6-27b"
    named = dataclasses.replace(base, args={"served-model-name": "qwen"})
    assert engines.served_name(named) == "qwen"
    llama = ServerSpec("l", "command", "tiny", (), 8080, 0, command=("llama-server", "-a", "t"))
    assert engines.served_name(llama) == "t"
    alias = dataclasses.replace(llama, command=("llama-server", "--alias=tiny2"))
    assert engines.served_name(alias) == "tiny2"
    assert engines.unit_name("q") == "ct200-server-q.service"
    assert engines.server_of_unit("ct200-server-q.service") == "q"
    assert engines.server_of_unit("sshd.service") is None
    assert engines.program(base) == "/usr/bin/python3"
    assert engines.base_url(dataclasses.replace(base, host="::")) == "http://[::1]:30000"


# -- crash semantics (issue 19): a crash loop named as one, a restart as a restart --------------


def test_a_unit_stopped_by_its_start_limit_is_named_a_crash_loop_with_its_last_exit() -> None:
    """The recorded unit that failed after 3 restarts (systemd 252: Result stays exit-code)."""
    from ct200_tools.doctor.checks import run_checks  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415
    from tests.unit import server_facts as sf  # noqa: PLC0415

    facts = sf.with_unit("limit")(sf.llama("stopped"))
    got = {f.id: f for f in run_checks(facts, load_spec(sf.LLAMA_SPEC))}["server.unit"]
    assert got.status == "fail"
    assert "is in a crash loop: its starts failed in a row without serving" in got.summary
    assert "3 restarts, last exit status 1" in got.summary, got.summary


def test_a_unit_between_a_crash_and_its_restart_is_restarting_not_starting() -> None:
    """derived: the recorded failed unit in its RestartSec delay (activating, auto-restart)."""
    import dataclasses  # noqa: PLC0415

    from ct200_tools.doctor.checks import run_checks  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415
    from tests.unit import server_facts as sf  # noqa: PLC0415

    unit = dataclasses.replace(
        sf.recorded_unit("fail"), active_state="activating", sub_state="auto-restart"
    )
    unit = dataclasses.replace(unit, journal_tail=("error: invalid argument: --x\x1b[0m",))
    facts = sf.server(sf.llama("stopped"), unit=unit)
    checks = {f.id: f for f in run_checks(facts, load_spec(sf.LLAMA_SPEC))}
    got = checks["server.unit"]
    # A failure and the root cause (issue 33: a crash at boot read as a warning and the port
    # took the blame), with the engine's last words, escaped.
    assert got.status == "fail"
    assert "exited and is restarting after a failure (restart 1, last exit status 2)" in got.summary
    assert "a big model loads" not in got.summary
    assert "llama: journal: error: invalid argument: --x\\x1b[0m" in got.evidence, got.evidence


def test_an_active_unit_on_an_older_configuration_is_named_with_the_restart(
    tmp_path: Path,
) -> None:
    """Issue 33: the doctor reads the process, not only the unit file. An active unit whose
    EnvironmentFile was written after its process started (from the start time systemd gives
    and the file's time, the file on a tree standing in for /) is a warning with the restart that
    applies it."""
    from ct200_tools.doctor.checks import run_checks  # noqa: PLC0415
    from ct200_tools.spec import load_spec  # noqa: PLC0415

    server = sf.the_server(sf.llama("serving")).name
    name = engines.unit_name(server)
    env_path = engines.env_path(server)
    env = tmp_path / env_path.lstrip("/")
    env.parent.mkdir(parents=True)
    env.write_text("X=1\n")
    started_mono_us = 1_000_000  # 1 s after this machine's monotonic clock started
    show = (
        f"Id={name}\nLoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n"
        f"NRestarts=0\nMainPID=42\nExecMainStatus=0\nNeedDaemonReload=no\n"
        f"FragmentPath=/etc/systemd/system/{name}\n"
        f"ExecMainStartTimestampMonotonic={started_mono_us}\n"
    )
    r = Replay(0, show)
    r.root = tmp_path
    got = probe_units(r, [name], "servers.units", {name: (env_path,)})
    (reason,) = got[name].older_configuration
    assert reason.startswith(f"{env_path} was written ") and "after the process started" in reason
    facts = sf.server(sf.llama("serving"), unit=got[name])
    verdict = {f.id: f for f in run_checks(facts, load_spec(sf.LLAMA_SPEC))}["server.unit"]
    assert verdict.status == "warn", verdict
    assert "is running an older configuration" in verdict.summary
    fix = verdict.remediation
    assert fix is not None and fix.command == f"systemctl restart {name}", fix
