"""Facts: what the probes read off a machine, as plain frozen dataclasses that round-trip JSON.

A sick machine's facts can be saved (`ct200-doctor snapshot`) and judged anywhere
(`ct200-doctor check --facts FILE`); tests judge facts recorded on real machines.
Anything a probe could not read is None in its field and explained in `Facts.unreadable`.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ct200_tools.untrusted import UntrustedInputError, read_bounded

#: Bump when a field changes meaning or is removed; adding optional fields keeps the version.
SCHEMA_VERSION = 1

T = TypeVar("T")

#: Field metadata of an optional field added after snapshots were recorded without it: left out
#: of the JSON while it holds its default, so a recorded snapshot reads and writes back byte for
#: byte (and SCHEMA_VERSION stays).
LATER = {"omit_default": True}


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML sees it."""

    index: int
    name: str
    #: Normalised sysfs form, lower case: 0000:00:06.0
    pci_bus_id: str
    uuid: str
    memory_total_bytes: int | None = None
    link_gen_current: int | None = None
    link_width_current: int | None = None
    #: Max link the GPU and the slot it sits in can do (nvmlDeviceGetMaxPcieLink*).
    link_gen_max: int | None = None
    link_width_max: int | None = None
    #: The GPU's own capability, whatever the slot (nvmlDeviceGetGpuMaxPcieLinkGeneration).
    device_link_gen_max: int | None = None
    persistence_mode: bool | None = None
    ecc_mode_current: bool | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    #: Bitmask of nvmlClocksEventReason* (formerly "throttle reasons").
    clocks_event_reasons: int | None = None
    cpu_affinity: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopoLink:
    """One ordered GPU pair (a < b): common ancestor letter and P2P status."""

    a: int
    b: int
    #: PIX, PXB, PHB, NODE, SYS, NV<n> or X (same board) -- the letters of `nvidia-smi topo -m`.
    level: str | None
    p2p_read: str | None = None
    p2p_write: str | None = None


@dataclass(frozen=True)
class NvmlFacts:
    driver_version: str | None = None
    nvml_version: str | None = None
    #: nvmlSystemGetCudaDriverVersion, e.g. 13000.
    cuda_driver_version: int | None = None
    gpus: tuple[GpuFacts, ...] = ()
    links: tuple[TopoLink, ...] = ()


@dataclass(frozen=True)
class CudaGpuInit:
    """One GPU's own CUDA child (per-GPU mode): CUDA_VISIBLE_DEVICES names that GPU alone, then
    cuInit, cuDeviceGet(0) and its primary context retained and released."""

    #: Its place in the driver's bus-ordered GPU list (nvidia-smi's index when every GPU is
    #: visible here); None when the caller's CUDA_VISIBLE_DEVICES entry is not a number.
    index: int | None = None
    #: What CUDA_VISIBLE_DEVICES was in the child: the GPU's UUID, an index, or an entry of the
    #: caller's own CUDA_VISIBLE_DEVICES.
    visible: str = ""
    #: The GPU meant, from /proc/driver/nvidia/gpus (sysfs form, lower case); else CUDA's.
    pci_bus_id: str | None = None
    #: Its /dev/nvidiaN (the driver's minor: usually, not always, the index).
    minor: int | None = None
    #: The GPU CUDA opened (cuDeviceGetPCIBusId), when the child got that far.
    cuda_bus_id: str | None = None
    #: CUresult of the first call that failed, 0 when all succeeded; None when none returned.
    code: int | None = None
    name: str | None = None
    #: The call that returned `code`, when it failed (cuInit, cuDeviceGet, ...).
    step: str | None = None
    #: Wall time of the child, from its start.
    duration_s: float | None = None
    #: Inside the child: cuInit, and retaining plus releasing the primary context.
    cuinit_s: float | None = None
    context_s: float | None = None
    timed_out: bool = False
    #: Why there is no code (libcuda missing, the child died, the driver excludes the GPU).
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def label(self) -> str:
        """'GPU3 0000:61:00.0', as the other gpu.* checks name a GPU."""
        who = f"GPU{self.index}" if self.index is not None else f"GPU {self.visible!r}"
        return f"{who} {self.pci_bus_id}" if self.pci_bus_id else who


@dataclass(frozen=True)
class CudaFacts:
    """Result of cuInit(0) in a child process (mode "all"), or of one child per GPU (mode
    "per-gpu": `gpus` holds each; the fields above it sum them up)."""

    #: CUresult; None when the child never reported (timeout, libcuda missing). Per GPU: 0 when
    #: every GPU passed, else the first failing GPU's.
    code: int | None = None
    name: str | None = None
    #: Per GPU: how many passed (None when none did).
    device_count: int | None = None
    driver_version: int | None = None
    duration_s: float | None = None
    #: Per GPU: every child timed out.
    timed_out: bool = False
    #: Why there is no code, e.g. "libcuda.so.1 not found".
    error: str | None = None
    #: "per-gpu" or "all" (None: recorded before per-GPU mode existed, which is "all").
    mode: str | None = field(default=None, metadata=LATER)
    gpus: tuple[CudaGpuInit, ...] = field(default=(), metadata=LATER)
    #: Why per-GPU mode was asked for but one all-GPU child ran (no GPU listed before cuInit).
    note: str | None = field(default=None, metadata=LATER)

    @property
    def failing(self) -> tuple[CudaGpuInit, ...]:
        return tuple(g for g in self.gpus if not g.ok)


@dataclass(frozen=True)
class DevNode:
    path: str
    exists: bool
    is_char: bool = False
    major: int | None = None
    minor: int | None = None
    mode: int | None = None
    #: 0 when open(O_RDWR) worked, else the errno; None when not tried.
    open_errno: int | None = None


@dataclass(frozen=True)
class DeviceFacts:
    #: Character-device majors by driver name, from /proc/devices.
    majors: dict[str, int] = field(default_factory=dict)
    nodes: tuple[DevNode, ...] = ()

    def node(self, path: str) -> DevNode | None:
        return next((n for n in self.nodes if n.path == path), None)


@dataclass(frozen=True)
class PciFacts:
    """One NVIDIA GPU function as sysfs sees it, independent of the driver."""

    bdf: str
    device_id: str | None = None
    numa_node: int | None = None
    local_cpus: tuple[int, ...] = ()
    #: How many bytes of config space this process may read (64 when unprivileged).
    config_readable: int | None = None
    max_read_request: int | None = None
    max_payload: int | None = None
    max_link_speed: str | None = None
    max_link_width: int | None = None
    current_link_speed: str | None = None
    current_link_width: int | None = None


@dataclass(frozen=True)
class KernelFacts:
    release: str | None = None
    cmdline: str | None = None
    numa_balancing: int | None = None
    #: Version from /proc/driver/nvidia/version; None when the module is not loaded.
    nvidia_module_version: str | None = None
    #: "lxc", "docker", "podman", "systemd-nspawn", other names, or "none".
    container: str | None = None
    #: Each sysfs tuning of ct200_tools.tunings as read here: tuning key -> item -> value
    #: ({"cpu_governor": {"cpu0": "performance", ...}}); a tuning with no file here is absent.
    tunings: dict[str, dict[str, str]] = field(default_factory=dict, metadata=LATER)


@dataclass(frozen=True)
class MemoryFacts:
    shm_path: str = "/dev/shm"
    shm_exists: bool = False
    shm_fstype: str | None = None
    shm_size: int | None = None
    shm_free: int | None = None
    cgroup_version: int | None = None
    #: None: no limit (or unreadable; see Facts.unreadable).
    memory_max: int | None = None
    memory_current: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    mem_total: int | None = None
    mem_available: int | None = None


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a staged tree as a walk finds it: symlinks to files followed (a stage copies
    them as files), our own top-level files and the top-level .cache/.git folders left out."""

    path: str
    #: Bytes of the regular file it is (or points to); None when it is not one.
    size: int | None = None
    #: Why it is not a plain file: "a symlink to a directory", "not a regular file", the
    #: error of stat(), or "cannot list it: ..." for a folder that could not be read.
    problem: str | None = None
    #: (st_ino, st_size, st_mtime_ns, st_ctime_ns) of the file, compared with the marker's.
    identity: tuple[int, ...] | None = field(default=None, metadata={"omit_default": True})


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    #: Its chunk hashes in the manifest; recorded with --deep only, for the re-hash to meet.
    chunks: tuple[str, ...] = ()


@dataclass(frozen=True)
class ManifestFacts:
    """A ct200-stage manifest as read (the parser already checked it against its own digest)."""

    digest: str
    algorithm: str
    chunk_size: int
    files: tuple[ManifestFile, ...] = ()


@dataclass(frozen=True)
class MarkerFacts:
    """The marker a finished stage writes into the tree: which manifest, when, from where."""

    manifest_digest: str
    name: str = ""
    source: str = ""
    staged_at: str = ""
    files: int = 0
    bytes: int = 0
    #: Each file's (st_ino, st_size, st_mtime_ns, st_ctime_ns) as staged (stage/tree.Marker);
    #: None for a marker of an older ct200-stage.
    identities: dict[str, tuple[int, ...]] | None = field(
        default=None, metadata={"omit_default": True}
    )


@dataclass(frozen=True)
class RehashedFile:
    """One file's chunks hashed now (--deep), with its manifest's algorithm and chunk size."""

    path: str
    chunks: tuple[str, ...] = ()
    #: Why reading stopped early; the chunks hashed before it are kept.
    error: str | None = None


@dataclass(frozen=True)
class StagedTreeFacts:
    """What is at a model's staged path, read and not judged (stage/verdict.py judges it, for
    the doctor and `ct200-stage status` alike)."""

    path: str
    #: Anything at the path (a symlink counts).
    exists: bool = False
    is_dir: bool = False
    #: The partial tree a stage builds beside it (.NAME.ct200-partial) is there.
    partial: bool = False
    #: The pid a stage holding the target's lock wrote (-1: not a number); None: nobody holds it.
    lock_pid: int | None = None
    #: Why the tree could not be read (listing it, reading its marker or manifest): path: error.
    error: str | None = None
    marker: MarkerFacts | None = None
    #: The marker file is there but is not a marker: why.
    marker_error: str | None = None
    #: The manifest the tree carries; None when it has none or it is not valid (manifest_error).
    manifest: ManifestFacts | None = None
    manifest_error: str | None = None
    #: Every entry of the tree; None when it was not walked (no marker: nothing to compare).
    entries: tuple[TreeEntry, ...] | None = None
    #: The source's manifest it is compared with, when one was found; its digest or why not.
    source_manifest: str | None = None
    source_manifest_digest: str | None = None
    source_manifest_error: str | None = None
    #: --deep was asked: re-hash the files when marker and manifests name the same content.
    deep: bool = False
    #: The manifest's files present in the tree, re-hashed; None when not re-hashed.
    rehashed: tuple[RehashedFile, ...] | None = None


@dataclass(frozen=True)
class ModelFacts:
    name: str
    source_exists: bool | None = None
    source_bytes: int | None = None
    staged_exists: bool | None = None
    staged_bytes: int | None = None
    #: The staged tree as read; None when not probed (or in a snapshot of an older doctor).
    staged_tree: StagedTreeFacts | None = None
    #: Snapshots from doctors before staged_tree carry the verdict itself (staged, missing,
    #: partial, unmarked, mismatch, unreadable) in these four fields; the probe no longer writes
    #: them, and stage/verdict.py judges staged_tree instead whenever it is there.
    stage_state: str | None = None
    stage_detail: str | None = None
    deep: bool = False
    stage_pid: int | None = None


@dataclass(frozen=True)
class ServingFacts:
    """The serving set: which servers run now (`/var/lib/ct200/serving.json`, written by the
    switch). Absent, the spec's `enabled` flags decide."""

    path: str
    exists: bool = False
    #: The servers it names; None when the file is absent or not a serving set (see error).
    servers: tuple[str, ...] | None = None
    error: str | None = None


@dataclass(frozen=True)
class UnitFacts:
    """A server's systemd unit as `systemctl show` gives it."""

    name: str
    #: loaded, not-found, masked, ... (LoadState).
    load_state: str | None = None
    active_state: str | None = None
    sub_state: str | None = None
    #: success, exit-code, signal, timeout, start-limit-hit, ... (Result).
    result: str | None = None
    n_restarts: int | None = None
    #: 0 when no main process runs.
    main_pid: int | None = None
    exec_main_status: int | None = None
    #: The unit's cgroup below the cgroup root, e.g. /system.slice/ct200-server-x.service.
    control_group: str | None = None
    #: Its last journal lines of this boot (as logged, unescaped), read only for a unit that is
    #: not active: what the engine said when it exited (issue 33: a crash is the root cause).
    journal_tail: tuple[str, ...] = ()
    #: Why its running process runs an older configuration than its files (NeedDaemonReload, a
    #: unit, EnvironmentFile or config written after the process started); empty: current.
    older_configuration: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortHolder:
    """A socket listening on a server's port, and the process that holds it when readable."""

    address: str
    pid: int | None = None
    #: /proc/PID/comm.
    name: str | None = None
    #: The systemd unit whose cgroup the process is in (from /proc/PID/cgroup).
    unit: str | None = None
    #: Why the holder is not known (other users' /proc/PID/fd need root).
    why_unknown: str | None = None


@dataclass(frozen=True)
class HttpFacts:
    """One request to a server: its status and what it answered, or why there was no answer."""

    url: str
    status: int | None = None
    duration_s: float | None = None
    #: No answer: refused, timed out after N s, reset, ...; or an answer that is not what the
    #: API promises (not JSON, no choices).
    error: str | None = None
    #: GET /v1/models: the ids it lists.
    served: tuple[str, ...] | None = None
    #: POST /v1/completions: the tokens generated (usage.completion_tokens).
    tokens: int | None = None
    #: The start of a body that was not what the API promises, for the evidence.
    body: str | None = None


@dataclass(frozen=True)
class EngineFacts:
    """What the unit would run: the interpreter (sglang, vllm) or argv[0] (command), and the
    compressed-tensors version in the engine's own environment."""

    #: The interpreter (sglang, vllm) or the command's argv[0] as the spec gives it.
    path: str
    #: argv[0] resolved on PATH when the spec gives a bare name; None when not found.
    resolved: str | None = None
    exists: bool = False
    executable: bool = False
    #: The module the interpreter must find (sglang, vllm); None for engine command.
    module: str | None = None
    #: The interpreter whose environment was read (the engine's, or a command that is a
    #: Python); None: not a Python, so no compressed-tensors to read.
    python: str | None = None
    module_found: bool | None = None
    #: The engine's distribution and its version in that environment.
    dist: str | None = None
    dist_version: str | None = None
    #: compressed-tensors in that environment; None when not installed (or not read: error).
    compressed_tensors: str | None = None
    #: What the engine's distribution requires of compressed-tensors (its Requires-Dist).
    ct_requirement: str | None = None
    #: Why the engine's environment could not be read (the interpreter failed or timed out).
    error: str | None = None


@dataclass(frozen=True)
class QuantFacts:
    """A staged model's quantization_config (config.json), as far as compressed-tensors goes."""

    config: str
    #: False: the staged model has no config.json (not a Hugging Face checkpoint, e.g. a GGUF).
    exists: bool = True
    #: compressed-tensors, fp8, awq, ...; None: no quantization_config.
    quant_method: str | None = None
    #: The model's format (nvfp4-pack-quantized, mixed-precision, ...).
    format: str | None = None
    #: Each config group's own format (mixed-precision models), in order, without repeats.
    group_formats: tuple[str, ...] = ()
    #: compressed-tensors version that wrote it (quantization_config.version).
    written_by: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProcessGpuFacts:
    """The GPUs a running server's processes use."""

    #: The processes of the unit (its cgroup, else its main PID).
    pids: tuple[int, ...] = ()
    #: CUDA_VISIBLE_DEVICES of each process that could be read, by pid ("" set empty; None
    #: unset).
    visible: dict[str, str | None] = field(default_factory=dict)
    #: The GPU indices NVML lists any of those pids on (nvmlDeviceGetComputeRunningProcesses);
    #: None when NVML could not be asked.
    nvml_gpus: tuple[int, ...] | None = None
    #: Every pid NVML lists on any GPU, to tell "not using a GPU" from "another PID namespace".
    nvml_pids: tuple[int, ...] = ()
    why_no_nvml: str | None = None
    why_no_environ: str | None = None


@dataclass(frozen=True)
class ServerFacts:
    name: str
    unit: UnitFacts | None = None
    #: Sockets listening on the server's port; None when not read (see unreadable).
    listeners: tuple[PortHolder, ...] | None = None
    #: TCP connect to the port: None connected; else why not. Not tried: not in facts.
    connect_error: str | None = None
    connected: bool | None = None
    models: HttpFacts | None = None
    generation: HttpFacts | None = None
    engine: EngineFacts | None = None
    quant: QuantFacts | None = None
    gpus: ProcessGpuFacts | None = None


@dataclass(frozen=True)
class BridgeFacts:
    """A PCIe bridge (switch port or root port) above a GPU, and its ACS Control register."""

    bdf: str
    #: The GPUs below it.
    gpus: tuple[str, ...] = ()
    #: Whether its extended config space has an ACS capability; None when it was not readable.
    has_acs: bool | None = None
    #: ACS Control (capability + 6); None without ACS or when unreadable.
    acs_ctl: int | None = None


@dataclass(frozen=True)
class LxcConfFacts:
    """The container's PVE config as read on the host (/etc/pve/lxc/<vmid>.conf)."""

    vmid: int
    path: str
    exists: bool = False
    #: The file as read; None when absent or unreadable (`unreadable` says why).
    text: str | None = None
    #: The spec's passthrough mode (devn, raw-lxc) the config is judged against.
    passthrough: str = "devn"


@dataclass(frozen=True)
class HostFacts:
    """The PVE host as `check --host` reads it: locally (`--host local`) or over SSH."""

    #: "local", or "ssh USER@HOST:PORT".
    via: str
    hostname: str | None = None
    kernel: KernelFacts | None = None
    devices: DeviceFacts | None = None
    pci: tuple[PciFacts, ...] | None = None
    bridges: tuple[BridgeFacts, ...] | None = None
    lxc: LxcConfFacts | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class ProbeRun:
    name: str
    duration_s: float
    #: "ok", "error" (raised; see error) or "timeout".
    outcome: str = "ok"
    error: str | None = None


@dataclass(frozen=True)
class Facts:
    schema_version: int = SCHEMA_VERSION
    collected_at: str = ""
    hostname: str = ""
    doctor_version: str = ""
    kernel: KernelFacts | None = None
    devices: DeviceFacts | None = None
    pci: tuple[PciFacts, ...] | None = None
    nvml: NvmlFacts | None = None
    cuda: CudaFacts | None = None
    memory: MemoryFacts | None = None
    models: tuple[ModelFacts, ...] | None = None
    serving: ServingFacts | None = None
    servers: tuple[ServerFacts, ...] | None = None
    #: The PVE host, read only by `check --host` (absent otherwise: its checks skip).
    host: HostFacts | None = field(default=None, metadata=LATER)
    probes: tuple[ProbeRun, ...] = ()
    #: "<probe>[.<what>]" -> why it could not be read. Checks turn these into skips, never failures.
    unreadable: dict[str, str] = field(default_factory=dict)

    def why_unreadable(self, *keys: str) -> str | None:
        """The first recorded reason for any key or key prefix, for skip messages."""
        for key in keys:
            for k, why in self.unreadable.items():
                if k == key or k.startswith(key + "."):
                    return f"{k}: {why}"
        return None


class FactsFormatError(ValueError):
    """A facts document that this doctor cannot read."""


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default, also when a factory makes it (an empty dict)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.metadata.get("omit_default") and getattr(obj, f.name) == _default(f))
        }
    if isinstance(obj, tuple | list):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def dumps(facts: Facts) -> str:
    return json.dumps(to_jsonable(facts), indent=2, sort_keys=False) + "\n"


#: A snapshot is tens of KB; anything past this is not one (and `--facts /dev/zero` must end).
MAX_FACTS_BYTES = 64 * 2**20
#: No fact needs more digits (byte counts fit in 20); Python itself refuses past 4300, without
#: saying where.
MAX_INT_DIGITS = 24
#: The sections the probes fill. Null only where `unreadable` says why (the probe records it):
#: a silent null would make every check of that section skip, and the run look clean.
SECTIONS = ("kernel", "devices", "pci", "nvml", "cuda", "memory", "models", "serving", "servers")
#: Sections added after schema version 1 was first written: a snapshot of an older doctor has
#: no key for them, and loads says so in `unreadable` (its checks skip with that reason).
LATER_SECTIONS = ("serving", "servers")
#: Why a section in LATER_SECTIONS is absent from a snapshot.
OLDER_SNAPSHOT = "not in this snapshot: it was taken by a doctor that did not read it"
_CONVERT = "facts files are UTF-8, as `ct200-doctor snapshot` writes them"
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32LE"),
    (codecs.BOM_UTF32_BE, "UTF-32BE"),
    (codecs.BOM_UTF16_LE, "UTF-16LE"),
    (codecs.BOM_UTF16_BE, "UTF-16BE"),
)


#: What to do about a facts file that cannot be read at all.
READ_FIX = (
    "take a snapshot on the machine (`ct200-doctor snapshot > facts.json`) and pass that file"
)


def read_file(path: str | os.PathLike[str]) -> Facts:
    """Read and parse a facts file, at most MAX_FACTS_BYTES of it, as a file from outside
    (untrusted.read_bounded: a FIFO or a device is refused, never waited on). UntrustedInputError
    when it cannot be read; FactsFormatError, naming the encoding or the line, when it is not a
    facts document."""
    try:
        data = read_bounded(path, "facts file", MAX_FACTS_BYTES, READ_FIX)
    except UntrustedInputError as exc:
        if exc.problem != "too-large":
            raise
        raise FactsFormatError(
            f"larger than {MAX_FACTS_BYTES >> 20} MiB: not a facts snapshot (one is tens of KB)"
        ) from None
    return loads(decode(data))


def decode(data: bytes) -> str:
    """UTF-8 (a UTF-8 byte-order mark is allowed); anything else is named, with where it shows."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise FactsFormatError(
                f"encoded as {name} (byte-order mark at the start); {_CONVERT}: "
                f"convert it with iconv -f {name} -t UTF-8"
            )
    nul = data.find(b"\0")
    if nul >= 0:
        guess = " (UTF-16 or UTF-32 without a byte-order mark?)" if nul < 4 else ""
        raise FactsFormatError(
            f"a NUL byte at {_where(data, nul)}{guess}: not a text file; {_CONVERT}"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FactsFormatError(
            f"not UTF-8: byte 0x{data[exc.start]:02x} at {_where(data, exc.start)} (Latin-1 or "
            f"another 8-bit encoding?); {_CONVERT}: convert it with iconv -f LATIN1 -t UTF-8"
        ) from None


def _where(data: bytes | str, pos: int) -> str:
    nl = b"\n" if isinstance(data, bytes) else "\n"
    line = data.count(nl, 0, pos) + 1  # type: ignore[arg-type]
    column = pos - (data.rfind(nl, 0, pos) + 1) + 1  # type: ignore[arg-type]
    return f"line {line}, column {column}"


class _BadNumber(ValueError):
    def __init__(self, text: str, what: str, why: str) -> None:
        super().__init__(text)
        self.text, self.what, self.why = text, what, why


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _BadNumber(
            text, f"an integer of {digits} digits", f"no fact has more than {MAX_INT_DIGITS}"
        )
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(text, text[:40], "too large for any fact")
    return value


def _parse_constant(text: str) -> Any:
    raise _BadNumber(text, text, "not a number JSON allows, nor any fact")


def loads(text: str) -> Facts:
    """Parse a facts document; FactsFormatError names what is wrong and what to do."""
    try:
        data = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        raise FactsFormatError(f"not JSON ({exc})") from None
    except _BadNumber as exc:
        pos = text.find(exc.text)
        where = f" at {_where(text, pos)}" if pos >= 0 else ""
        raise FactsFormatError(f"{exc.what}{where}: {exc.why}") from None
    except RecursionError:
        raise FactsFormatError("nested too deeply to be a facts document") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise FactsFormatError("not a ct200-doctor facts document (no schema_version)")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise FactsFormatError(
            f"schema_version {version!r}, this doctor reads {SCHEMA_VERSION}: "
            "take the snapshot again with this version of ct200-doctor"
        )
    try:
        facts: Facts = _build(Facts, data, "facts")
    except (TypeError, ValueError, KeyError, RecursionError) as exc:
        raise FactsFormatError(str(exc) or type(exc).__name__) from None
    older = {
        n: OLDER_SNAPSHOT for n in LATER_SECTIONS if n not in data and n not in facts.unreadable
    }
    if older:
        facts = dataclasses.replace(facts, unreadable={**facts.unreadable, **older})
    for name in SECTIONS:
        if getattr(facts, name) is None and name not in facts.unreadable:
            state = "null" if name in data else "missing"
            raise FactsFormatError(
                f"facts.{name} is {state} and facts.unreadable.{name} does not say why: a "
                "snapshot records why a probe could not read a section; take it again with "
                "`ct200-doctor snapshot`"
            )
    return facts


def _build(tp: Any, value: Any, where: str) -> Any:  # noqa: PLR0912
    """Rebuild a typed value from JSON data, checking types as it goes."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        kwargs = {k: _build(hints[k], v, f"{where}.{k}") for k, v in value.items() if k in known}
        try:
            return tp(**kwargs)  # type: ignore[operator]
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from None
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"{where}: expected a list")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_build(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected an object")
        _, vt = typing.get_args(tp)
        return {str(k): _build(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{where}: expected a number")
    if tp in (int, str, bool):
        if type(value) is not tp:
            raise TypeError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    if tp is Any:
        return value
    raise TypeError(f"{where}: unsupported type {tp!r}")
