"""Start the slow driver initialisations before Python imports the rest of the doctor.

cuInit (~0.3 s per H200, serial inside one process) and nvmlInit (~0.2 s) dominate a check.
Both need nothing from the doctor's own modules, so the console entry starts them first; the
probes then collect the result. Stdlib only: importing anything heavier here would delay exactly
what this saves.

Two ways to initialise CUDA (`--cuda-init`):

- per-gpu (default): one child per GPU, all at once, each with CUDA_VISIBLE_DEVICES naming its GPU
  alone; each calls cuInit, takes the GPU (cuDeviceGet(0)) and retains and releases its primary
  context, the one PyTorch and the servers use. One cuInit initialises every GPU it can see, one
  after the other; children that each see one GPU do it side by side, and say which GPU fails.
- all: one child, one cuInit over every visible GPU (the probe before per-GPU mode; kept for
  comparison and for what needs every GPU in one process, such as P2P).

The GPU list must be known before cuInit and before the spec is read (this runs first), without
NVML (its init is one of the slow calls) and without touching the driver: it is the listing of
/proc/driver/nvidia/gpus, one directory per GPU the kernel module has bound, named by bus id.
Listing a procfs directory calls nothing in the driver; each child reads its own GPU's
`information` file (the UUID it uses for CUDA_VISIBLE_DEVICES and its /dev/nvidiaN minor), since
that read goes through the driver and so may block on a sick GPU: in the child it is under the
child's deadline. How this list can differ from what the spec expects:

- no /proc/driver/nvidia (module not loaded: a machine without GPUs, this one included), or an
  empty list: one all-GPU child instead, which reports why CUDA cannot start (the facts say so);
  where /proc/driver/nvidia cannot be listed but /dev/nvidiaN nodes exist (a sandbox passing
  the nodes only), one child per node, by index in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID),
  each reporting the bus id CUDA opened;
- a GPU that fell off the bus stays listed while the driver holds it: its child fails and the
  doctor names it; a GPU gone from the PCI bus (never enumerated, removed) is not listed, so it
  gets no child: gpu.count (spec against NVML and the PCI bus) reports it;
- an LXC container sees the host's whole list (procfs is not namespaced); a GPU whose
  /dev/nvidiaN is not passed through fails in its child (CUDA cannot see it), and dev.nodes names
  the missing node;
- a GPU the driver excludes (NVreg_ExcludedGpus) is listed; its child says so without cuInit;
- where the driver shows no UUID, the child falls back to the GPU's place in the bus-ordered list
  with CUDA_DEVICE_ORDER=PCI_BUS_ID; each child reports the bus id CUDA opened, so a mismatch
  shows in the facts;
- CUDA_VISIBLE_DEVICES set for the doctor (a server's start gate): one child per entry, each
  with that entry alone, so the doctor judges exactly the GPUs the caller will use.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

PER_GPU = "per-gpu"
ALL = "all"
MODES = (PER_GPU, ALL)
DEFAULT_MODE = PER_GPU
GPUS_DIR = "proc/driver/nvidia/gpus"

# Runs in `python -I -S` (no site, no user paths): ctypes only, prints one JSON line.
CUDA_CHILD = r"""
import ctypes, json, sys
out = {}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print(json.dumps({"error": "libcuda.so.1 not found: " + str(exc)})); sys.exit(0)
code = cuda.cuInit(0)
out["code"] = code
name = ctypes.c_char_p()
if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
    out["name"] = name.value.decode()
v = ctypes.c_int()
if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
    out["driver_version"] = v.value
if code == 0:
    n = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(n)) == 0:
        out["device_count"] = n.value
print(json.dumps(out))
"""

# One GPU: argv = bus id (empty: CUDA_VISIBLE_DEVICES is the caller's), place in the list, root.
# Every path ends in one JSON line; the parent reads nothing else.
PER_GPU_CHILD = r"""
import ctypes, json, os, sys, time
bus, pos, root = sys.argv[1:4]
out = {}
def done():
    print(json.dumps(out)); sys.exit(0)
try:
    if bus:
        info = {}
        try:
            with open(os.path.join(root, "proc/driver/nvidia/gpus", bus, "information")) as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    info[key.strip()] = value.strip()
        except OSError as exc:
            out["info_error"] = str(exc)
        minor = info.get("Device Minor", "")
        if minor.isdigit():
            out["minor"] = int(minor)
        if "Yes" in (info.get("GPU Excluded"), info.get("Blacklisted")):
            out["error"] = "the driver excludes this GPU (NVreg_ExcludedGpus)"
            done()
        uuid = info.get("GPU UUID", "")
        if len(uuid) == 40 and uuid.startswith("GPU-") and "?" not in uuid:
            os.environ["CUDA_VISIBLE_DEVICES"] = uuid
        else:
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            os.environ["CUDA_VISIBLE_DEVICES"] = pos
    out["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = "libcuda.so.1 not found: " + str(exc)
        done()
    def result(step, code):
        out["code"] = code
        if code:
            out["step"] = step
        name = ctypes.c_char_p()
        if cuda.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            out["name"] = name.value.decode()
        if code:
            done()
    t0 = time.perf_counter()
    code = cuda.cuInit(0)
    out["cuinit_s"] = round(time.perf_counter() - t0, 4)
    v = ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
        out["driver_version"] = v.value
    result("cuInit", code)
    dev = ctypes.c_int()
    result("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    busid = ctypes.create_string_buffer(32)
    if cuda.cuDeviceGetPCIBusId(busid, 32, dev) == 0:
        out["cuda_bus_id"] = busid.value.decode()
    t0 = time.perf_counter()
    ctx = ctypes.c_void_p()
    result("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    try:
        release = cuda.cuDevicePrimaryCtxRelease_v2
    except AttributeError:
        release = cuda.cuDevicePrimaryCtxRelease
    code = release(dev)
    out["context_s"] = round(time.perf_counter() - t0, 4)
    result("cuDevicePrimaryCtxRelease", code)
except Exception as exc:
    out["error"] = "the child failed: %s: %s" % (type(exc).__name__, exc)
done()
"""


class Child:
    """One started CUDA child and what it was asked to initialise."""

    __slots__ = ("bus", "index", "proc", "started", "visible")

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        started: float,
        bus: str | None = None,
        index: int | None = None,
        visible: str = "",
    ) -> None:
        self.proc, self.started = proc, started
        self.bus, self.index, self.visible = bus, index, visible


class Started:
    """The CUDA children of one probe: the mode that ran, and why it differs from the one
    asked for (per-GPU mode with no GPU to list runs one all-GPU child)."""

    __slots__ = ("asked", "children", "gpus", "mode", "note", "root")

    def __init__(
        self,
        asked: str,
        mode: str,
        children: list[Child],
        note: str | None,
        root: str,
        gpus: tuple[int, ...] | None = None,
    ) -> None:
        self.asked, self.mode, self.children, self.note = asked, mode, children, note
        self.root, self.gpus = root, gpus

    def kill(self) -> None:
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.kill()
            c.proc.communicate()


_prestarted: Started | None = None


def _bus_key(bus: str) -> tuple[int, ...]:
    """0000:61:00.0 -> (0, 0x61, 0, 0): numeric, so a 5-digit VMD domain sorts after 0000."""
    try:
        domain, b, rest = bus.split(":")
        dev, fn = rest.split(".")
        return (int(domain, 16), int(b, 16), int(dev, 16), int(fn, 16))
    except ValueError:
        return (1 << 32, 0, 0, 0)


def list_gpus(root: str = "/") -> list[str]:
    """Bus ids of the GPUs the NVIDIA module has bound, in PCI bus order (CUDA's and NVML's).
    OSError when /proc/driver/nvidia/gpus cannot be listed (no module)."""
    return sorted(os.listdir(os.path.join(root, GPUS_DIR)), key=_bus_key)


def gpu_nodes(root: str = "/") -> list[int]:
    """The N of every /dev/nvidiaN here (where /proc/driver/nvidia/gpus cannot be listed: a
    sandbox that passes the nodes but not the driver's procfs)."""
    try:
        names = os.listdir(os.path.join(root, "dev"))
    except OSError:
        return []
    tails = (n.removeprefix("nvidia") for n in names if n.startswith("nvidia"))
    return sorted(int(t) for t in tails if t.isdigit())


def visible_entries(env: Mapping[str, str]) -> list[str] | None:
    """The caller's CUDA_VISIBLE_DEVICES entries; None when it is not set."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [e.strip() for e in value.split(",") if e.strip()]


def _popen(code: str, args: Sequence[str], env: Mapping[str, str]) -> Child:
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", code, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
    )
    return Child(proc, started)


def spawn_cuda_child() -> tuple[subprocess.Popen[bytes], float]:
    """The all-GPU child alone and its start time (the timeout counts from here), for a caller
    that wants just that process; the probe starts its children with spawn()."""
    c = _popen(CUDA_CHILD, (), os.environ)
    return c.proc, c.started


def spawn(mode: str = DEFAULT_MODE, root: str = "/", gpus: Sequence[int] | None = None) -> Started:
    """Start the CUDA children of `mode` (see the module's doc for how GPUs are listed).
    gpus: only these GPUs (nvidia-smi's indices, as a server's spec names them), instead of
    every GPU or the caller's CUDA_VISIBLE_DEVICES."""
    env = os.environ.copy()
    key = tuple(gpus) if gpus is not None else None
    if key is not None:
        env |= {"CUDA_VISIBLE_DEVICES": ",".join(map(str, key)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    children: list[Child] = []
    note: str | None = None
    if mode != ALL:
        children, note = _per_gpu(env, root, key)
    if not children:
        return Started(mode, ALL, [_popen(CUDA_CHILD, (), env)], note, root, key)
    return Started(mode, PER_GPU, children, note, root, key)


def _by_index(env: Mapping[str, str], root: str, i: int) -> Child:
    """GPU i by its place in PCI bus order, where its bus id (and so its UUID) is not known."""
    ordered = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(i)}
    c = _popen(PER_GPU_CHILD, ("", "", root), ordered)
    c.index, c.visible = i, str(i)
    return c


def _per_gpu(
    env: Mapping[str, str], root: str, gpus: tuple[int, ...] | None
) -> tuple[list[Child], str | None]:
    if gpus == ():
        return [], "no GPU asked for"
    entries = visible_entries(env)
    if gpus is None and entries is not None:  # the caller's own CUDA_VISIBLE_DEVICES
        children = []
        for e in entries:
            c = _popen(PER_GPU_CHILD, ("", "", root), {**env, "CUDA_VISIBLE_DEVICES": e})
            c.index, c.visible = (int(e) if e.isdigit() else None), e
            children.append(c)
        return children, None if children else "CUDA_VISIBLE_DEVICES is empty: it hides every GPU"
    try:
        buses = list_gpus(root)
    except OSError as exc:
        why = f"cannot list /{GPUS_DIR} ({exc.strerror})"
        wanted = list(gpus) if gpus is not None else gpu_nodes(root)
        if not wanted:
            return [], f"{why}: is the NVIDIA kernel module loaded?"
        how = (
            "one child per GPU asked for" if gpus is not None else "one child per /dev/nvidiaN node"
        )
        note = f"{why}: {how} ({len(wanted)}), by index in PCI bus order"
        indices = wanted if gpus is not None else range(len(wanted))
        return [_by_index(env, root, i) for i in indices], note
    if not buses and gpus is None:
        return [], f"/{GPUS_DIR} lists no GPU"
    children = []
    for i in gpus if gpus is not None else range(len(buses)):
        if i >= len(buses):  # not listed: CUDA says what it makes of the index
            children.append(_by_index(env, root, i))
            continue
        c = _popen(PER_GPU_CHILD, (buses[i], str(i), root), env)
        c.bus, c.index = buses[i], i
        children.append(c)
    return children, None


def take(mode: str = DEFAULT_MODE, root: str = "/", gpus: Sequence[int] | None = None) -> Started:
    """The prestarted children if they are what is asked for (once), else new ones."""
    global _prestarted
    got, _prestarted = _prestarted, None
    key = tuple(gpus) if gpus is not None else None
    if got is not None and (got.asked, got.root, got.gpus) == (mode, root, key):
        return got
    if got is not None:
        got.kill()
    return spawn(mode, root, gpus)


def _nvml_init() -> None:
    # NVML counts nvmlInit calls: the probe's own init and shutdown then cost almost nothing.
    # Errors are left for the probe to record; here they only mean nothing was gained.
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001, S110
        pass


def wants_probes(argv: Sequence[str]) -> bool:
    args = set(argv)
    return bool(args & {"check", "snapshot"}) and not args & {"--facts", "-h", "--help"}


def cuda_mode(argv: Sequence[str]) -> str | None:
    """The --cuda-init value on the command line (the default when absent); None when it is
    not a mode (the command line parser then refuses it, and nothing is worth starting)."""
    value = DEFAULT_MODE
    for i, arg in enumerate(argv):
        if arg == "--cuda-init":
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith("--cuda-init="):
            value = arg.partition("=")[2]
    return value if value in MODES else None


def start(argv: Sequence[str]) -> None:
    global _prestarted  # noqa: PLW0603
    mode = cuda_mode(argv)
    if _prestarted is None and mode is not None and wants_probes(argv):
        _prestarted = spawn(mode)
        threading.Thread(target=_nvml_init, name="warmup-nvml", daemon=True).start()
