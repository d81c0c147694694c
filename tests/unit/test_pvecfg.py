"""ct200_tools/host/pvecfg.py: the PVE container config parser and editor, against a corpus of
realistic configs (tests/fixtures/pve) and generated ones, and its PVE-style locked write."""

from __future__ import annotations

import ast
import fcntl
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ct200_tools.doctor.checks.dev import driver_of as doctor_driver_of
from ct200_tools.host import pvecfg
from ct200_tools.host.pvecfg import PveConfigError, Want

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/fixtures/pve"
H200_PROC = ROOT / "tests/fixtures/raw/h200/proc_devices.txt"
#: nvidia-uvm is 238 in the recorded /proc/devices of the H200 machine.
H200_MAJORS = pvecfg.parse_proc_devices(H200_PROC.read_text())
GPUS8 = tuple(f"/dev/nvidia{i}" for i in range(8))
NODES = (*GPUS8, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MOUNT = "none bind,optional,create=file"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


def edit(text: str, want: Want) -> pvecfg.Plan:
    return pvecfg.plan(pvecfg.parse(text), want)


def raw(devices: tuple[str, ...] = NODES, majors: dict[str, int] = H200_MAJORS) -> Want:
    return Want(devices, "raw-lxc", majors=majors)


def rest_of(text: str) -> str:
    return pvecfg.parse(text).rest


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.conf")), ids=lambda p: p.name)
def test_corpus_round_trips_byte_for_byte(path: Path) -> None:
    data = path.read_bytes()
    assert pvecfg.parse(data.decode()).render().encode() == data


def test_sections_start_at_the_first_header() -> None:
    cfg = pvecfg.parse(corpus("incident-raw.conf"))
    assert cfg.rest.startswith("[before-driver-595]\n")
    assert cfg.main_value("parent") == "before-driver-595"
    assert pvecfg.parse(corpus("pending-devn.conf")).rest.startswith("[pve:pending]\n")


def test_lines_are_classified_as_pve_reads_them() -> None:
    cfg = pvecfg.parse(corpus("mixed.conf"))
    kinds = {ln.text: (ln.kind, ln.key, ln.value) for ln in cfg.lines}
    assert kinds["#GPU 0 plus the iGPU render node for video decode"][0] == "comment"
    assert kinds["dev2: path=/dev/nvidiactl,mode=666"] == (
        "key",
        "dev2",
        "path=/dev/nvidiactl,mode=666",
    )
    assert kinds["lxc.cgroup2.devices.allow = c 10:200 rwm"] == (
        "lxc",
        "lxc.cgroup2.devices.allow",
        "c 10:200 rwm",
    )
    assert kinds["lxc.cap.drop: "] == ("lxc", "lxc.cap.drop", "")
    assert kinds["ct_note: an unknown key, kept as is"][:2] == ("key", "ct_note")
    assert [ln.dev_index for ln in cfg.lines if ln.dev_index is not None] == [0, 1, 2, 5]


def test_unparseable_lines_are_found_and_kept() -> None:
    text = corpus("unparseable.conf")
    cfg = pvecfg.parse(text)
    assert cfg.unparsed() == [(5, "lxc.cgroup2.devices.allow c 195:* rwm"), (6, "  swap: 0")]
    assert cfg.render() == text
    # The snapshot's odd line is not ours to judge.
    assert "this line is odd" in cfg.rest


def test_headers_are_what_pve_takes_for_headers() -> None:
    # pve-container: [pve:pending], or a snapshot name of two or more characters.
    assert pvecfg.is_section_header("[pve:pending]")
    assert pvecfg.is_section_header("[Before-Update_2] ")
    assert not pvecfg.is_section_header("[s]")
    assert not pvecfg.is_section_header("[2024-snap]")
    assert not pvecfg.is_section_header(" [snap]")


@pytest.mark.parametrize(
    "text",
    ["", "\n", "arch: amd64", "arch: amd64\n\n", "[snap]\narch: amd64", "a: 1\r\nb: 2\r\n"],
)
def test_edge_texts_round_trip(text: str) -> None:
    assert pvecfg.parse(text).render() == text


@given(st.text())
@settings(deadline=None, max_examples=300)
def test_any_text_round_trips(text: str) -> None:
    assert pvecfg.parse(text).render() == text


def test_proc_devices_reads_char_majors_only() -> None:
    assert H200_MAJORS["nvidia"] == 195
    assert H200_MAJORS["nvidia-uvm"] == 238
    assert H200_MAJORS["nvidia-caps"] == 241
    # 253 is both dimmctl (char) and zram (block): the block section must not leak in.
    assert H200_MAJORS["dimmctl"] == 253
    assert "zram" not in H200_MAJORS


@pytest.mark.parametrize(
    "path",
    [
        "/dev/nvidia0",
        "/dev/nvidia7",
        "/dev/nvidia15",
        "/dev/nvidiactl",
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-nvswitch0",
        "/dev/nvidia-nvlink",
    ],
)
def test_device_map_agrees_with_the_doctor(path: str) -> None:
    assert pvecfg.driver_of(path) == doctor_driver_of(path)
    assert pvecfg.driver_of(path) is not None


# --- editing: devn ---------------------------------------------------------------------------


def test_devn_on_a_fresh_config_adds_one_entry_per_node() -> None:
    text = corpus("fresh-pve8.conf")
    plan = edit(text, Want(NODES))
    lines = plan.after.splitlines()
    devs = [ln for ln in lines if ln.startswith("dev")]
    assert devs == [f"dev{i}: {p},mode=0666" for i, p in enumerate(NODES)]
    # After the last key line, nothing else moved.
    assert [ln for ln in lines if not ln.startswith("dev")] == text.splitlines()
    assert plan.changed and plan.added == tuple(devs) and not plan.removed
    assert edit(plan.after, Want(NODES)).changed is False


def test_devn_keeps_existing_entries_and_pending_indexes() -> None:
    text = corpus("pending-devn.conf")
    plan = edit(text, Want(("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1")))
    main = pvecfg.parse(plan.after).lines
    devs = [ln.text for ln in main if ln.dev_index is not None]
    # dev3 is taken by the pending change: the new node gets dev4, after the other entries.
    assert devs == [
        "dev0: /dev/nvidia0,mode=0666",
        "dev1: /dev/nvidiactl,mode=0666",
        "dev2: /dev/nvidia-uvm,mode=0666",
        "dev4: /dev/nvidia1,mode=0666",
    ]
    assert rest_of(plan.after) == rest_of(text)


def test_devn_replaces_stale_entries_in_place_and_drops_duplicates() -> None:
    text = corpus("mixed.conf")
    plan = edit(text, Want(("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"), mode="0666"))
    after = plan.after.splitlines()
    before = text.splitlines()
    # dev1 (mode 0660 + gid) becomes ours where it stood, the admin's gid kept; the duplicate
    # dev5 goes.
    assert after[before.index("dev1: /dev/nvidia0,mode=0660,gid=44")] == (
        "dev1: /dev/nvidia0,mode=0666,gid=44"
    )
    assert "dev5: /dev/nvidia0,mode=0666" not in after
    # The path= form stays as written; mode 666 is not PVE's 0[0-7]{3}: written as 0666.
    assert "dev2: path=/dev/nvidiactl,mode=0666" in after
    # The raw mount of a node now passed by devN goes; the cgroup v1 rule for 195 too.
    assert not any("/dev/nvidia-uvm   dev/nvidia-uvm" in ln for ln in after)
    assert "lxc.cgroup.devices.allow: c 195:* rwm" not in after
    # Unrelated lines stay, byte for byte: the iGPU, tun, idmaps, odd spacing, unknown keys.
    for line in (
        "dev0: /dev/dri/renderD128,gid=104",
        "lxc.cgroup2.devices.allow = c 10:200 rwm",
        "lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file",
        "lxc.cap.drop: ",
        "ct_note: an unknown key, kept as is",
        "lxc.idmap: g 0 100000 65536",
    ):
        assert line in after
    new = [ln for ln in after if ln.startswith("dev") and "nvidia-uvm" in ln]
    assert new == ["dev3: /dev/nvidia-uvm,mode=0666"]
    # A new entry goes after the last devN entry.
    assert after.index(new[0]) == after.index("dev2: path=/dev/nvidiactl,mode=0666") + 1


def test_raw_to_devn_removes_the_raw_lines_of_those_nodes_only() -> None:
    text = corpus("incident-raw.conf")
    plan = edit(text, Want(NODES, majors=H200_MAJORS))
    main = [ln.text for ln in pvecfg.parse(plan.after).lines]
    assert [ln for ln in main if ln.startswith("dev")] == [
        f"dev{i}: {p},mode=0666" for i, p in enumerate(NODES)
    ]
    assert not any("nvidia" in ln for ln in main if ln.startswith("lxc."))
    # 509 is a dynamic major no driver holds: a leftover, removed; 226 (DRM) is not ours.
    assert "lxc.cgroup2.devices.allow: c 509:* rwm" not in main
    assert "lxc.cgroup2.devices.allow: c 226:* rwm" in main
    assert "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir" in main
    # devN entries go before the raw lines, as pct set writes them.
    assert main.index("dev10: /dev/nvidia-uvm-tools,mode=0666") < main.index(
        "lxc.cgroup2.devices.allow: c 226:* rwm"
    )
    assert rest_of(plan.after) == rest_of(text)
    assert edit(plan.after, Want(NODES, majors=H200_MAJORS)).changed is False


# --- editing: raw-lxc ------------------------------------------------------------------------


def test_raw_lxc_replaces_the_stale_uvm_major_where_it_stands() -> None:
    """The incident: 509 written by hand, 238 on the host now."""
    text = corpus("incident-raw.conf")
    plan = edit(text, raw())
    before, after = text.splitlines(), plan.after.splitlines()
    at = before.index("lxc.cgroup2.devices.allow: c 509:* rwm")
    assert after[at] == "lxc.cgroup2.devices.allow: c 238:* rwm"
    assert plan.removed == ("lxc.cgroup2.devices.allow: c 509:* rwm",)
    assert plan.added == ("lxc.cgroup2.devices.allow: c 238:* rwm",)
    # Only that line changed; the snapshot keeps its own (old) lines byte for byte.
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [at]
    assert rest_of(plan.after) == rest_of(text)
    assert "c 509:* rwm" in rest_of(plan.after)
    assert edit(plan.after, raw()).changed is False


def test_raw_lxc_follows_the_major_after_a_driver_update() -> None:
    first = edit(corpus("incident-raw.conf"), raw()).after
    moved = {**H200_MAJORS, "nvidia-uvm": 511}
    plan = edit(first, raw(majors=moved))
    assert plan.removed == ("lxc.cgroup2.devices.allow: c 238:* rwm",)
    assert plan.added == ("lxc.cgroup2.devices.allow: c 511:* rwm",)
    assert plan.after.count("c 511:* rwm") == 1


def test_raw_lxc_on_a_fresh_config_and_from_devn() -> None:
    fresh = edit(corpus("fresh-pve8.conf"), raw())
    tail = fresh.after.splitlines()[-13:]
    assert tail == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 238:* rwm",
        *[f"lxc.mount.entry: {p} {p[1:]} {MOUNT}" for p in NODES],
    ]
    assert fresh.managed == tuple(tail)
    devs = edit(corpus("pending-devn.conf"), raw(("/dev/nvidia0", "/dev/nvidia-uvm")))
    main = [ln.text for ln in pvecfg.parse(devs.after).lines]
    assert "dev0: /dev/nvidia0,mode=0666" not in main
    assert "dev2: /dev/nvidia-uvm,mode=0666" not in main
    # dev1 (nvidiactl) is not in this list: not ours to remove.
    assert "dev1: /dev/nvidiactl,mode=0666" in main
    assert rest_of(devs.after) == rest_of(corpus("pending-devn.conf"))


def test_raw_lxc_moves_the_v1_key_to_cgroup2_in_place() -> None:
    text = corpus("mixed.conf")
    plan = edit(text, raw(("/dev/nvidia0", "/dev/nvidia-uvm")))
    before, after = text.splitlines(), plan.after.splitlines()
    # Where the v1 rule stood (after lxc.cap.drop); the uvm rule after the last allow rule.
    assert before[before.index("lxc.cap.drop: ") + 1] == "lxc.cgroup.devices.allow: c 195:* rwm"
    at = after.index("lxc.cap.drop: ") + 1
    assert after[at : at + 3] == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow = c 10:200 rwm",
        "lxc.cgroup2.devices.allow: c 238:* rwm",
    ]
    assert not any(ln.startswith("lxc.cgroup.devices.allow") for ln in after)
    # The uvm mount with odd spacing means the same: kept as written.
    assert "lxc.mount.entry:   /dev/nvidia-uvm   dev/nvidia-uvm none bind,optional,create=file" in (
        after
    )
    assert after.count("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 " + MOUNT) == 1


def test_caps_nodes_use_the_caps_major() -> None:
    plan = edit(corpus("fresh-pve8.conf"), raw(("/dev/nvidia-caps/nvidia-cap1",)))
    assert "lxc.cgroup2.devices.allow: c 241:* rwm" in plan.after.splitlines()


def test_no_trailing_newline_and_crlf_lines_survive() -> None:
    text = "arch: amd64\r\nhostname: ct\r\nswap: 0"
    plan = edit(text, Want(("/dev/nvidia0",)))
    # CRLF stays CRLF; the file still ends without a newline.
    assert plan.after == "arch: amd64\r\nhostname: ct\r\nswap: 0\r\ndev0: /dev/nvidia0,mode=0666"
    lf = edit("arch: amd64\nswap: 0", Want(("/dev/nvidia0",)))
    assert lf.after == "arch: amd64\nswap: 0\ndev0: /dev/nvidia0,mode=0666"
    empty = edit("", Want(("/dev/nvidia0",)))
    assert empty.after == "dev0: /dev/nvidia0,mode=0666\n"


# --- bad input -------------------------------------------------------------------------------


def test_unknown_device_path_is_refused() -> None:
    with pytest.raises(PveConfigError, match=r"/dev/dri/card0.*NVIDIA"):
        edit(corpus("fresh-pve8.conf"), Want(("/dev/nvidia0", "/dev/dri/card0")))


@pytest.mark.parametrize("mode", ["666x", "0999", "rw"])
def test_bad_mode_is_refused(mode: str) -> None:
    with pytest.raises(PveConfigError, match="octal"):
        edit(corpus("fresh-pve8.conf"), Want(("/dev/nvidia0",), mode=mode))


def test_raw_lxc_without_uvm_says_load_the_module_first() -> None:
    majors = {k: v for k, v in H200_MAJORS.items() if k != "nvidia-uvm"}
    with pytest.raises(PveConfigError, match=r"load the module first.*host_devices"):
        edit(corpus("fresh-pve8.conf"), raw(majors=majors))


def test_no_free_dev_index() -> None:
    text = "".join(f"dev{i}: /dev/null{i}\n" for i in range(pvecfg.MAX_DEV))
    with pytest.raises(PveConfigError, match="no free devN"):
        edit(text, Want(("/dev/nvidia0",)))


# --- applying to a file: lock, write like PVE, refusals ---------------------------------------


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "lxc"
    d.mkdir()
    return d


def place(conf_dir: Path, name: str, vmid: int = 200) -> Path:
    path = conf_dir / f"{vmid}.conf"
    shutil.copyfile(CORPUS / name, path)
    path.chmod(0o640)
    return path


def apply(
    path: Path,
    want: Want,
    tmp_path: Path,
    *,
    check: bool = False,
    proc_devices: Path = H200_PROC,
    timeout: float = pvecfg.LOCK_TIMEOUT,
) -> pvecfg.Result:
    return pvecfg.apply(
        str(path),
        want,
        check=check,
        proc_devices=str(proc_devices),
        lock_dir=str(tmp_path / "lock"),
        timeout=timeout,
    )


def state(path: Path) -> tuple[bytes, int, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_ino, st.st_mtime_ns, st.st_mode


def test_apply_writes_by_rename_keeping_the_mode(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "incident-raw.conf")
    ino = path.stat().st_ino
    result = apply(path, raw(), tmp_path)
    assert result.vmid == 200 and result.plan.changed
    assert result.majors == {k: v for k, v in H200_MAJORS.items() if k.startswith("nvidia")}
    assert path.read_text() == result.plan.after
    # A new inode: written beside and renamed over, never rewritten in place.
    assert path.stat().st_ino != ino
    assert path.stat().st_mode & 0o777 == 0o640
    # No temporary or backup file left beside it.
    assert sorted(p.name for p in conf_dir.iterdir()) == ["200.conf"]
    assert (tmp_path / "lock" / "pve-config-200.lock").exists()
    again = apply(path, raw(), tmp_path)
    assert not again.plan.changed


def test_check_mode_writes_nothing_and_takes_no_lock(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "fresh-pve8.conf")
    before = state(path)
    result = apply(path, Want(NODES), tmp_path, check=True)
    assert result.plan.changed
    assert state(path) == before
    assert not (tmp_path / "lock").exists()


def test_locked_container_is_refused_naming_the_lock(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "locked.conf", vmid=203)
    before = state(path)
    for check in (False, True):
        with pytest.raises(PveConfigError, match=r"'lock: backup'.*pct unlock 203"):
            apply(path, Want(NODES), tmp_path, check=check)
    assert state(path) == before
    assert sorted(p.name for p in conf_dir.iterdir()) == ["203.conf"]


def test_unparseable_main_section_is_refused(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "unparseable.conf", vmid=204)
    before = state(path)
    with pytest.raises(PveConfigError, match=r"line 5: 'lxc.cgroup2.devices.allow c 195"):
        apply(path, Want(NODES), tmp_path)
    assert state(path) == before


def test_missing_config_and_bad_name(conf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PveConfigError, match=r"container 299 does not exist.*pct list"):
        apply(conf_dir / "299.conf", Want(NODES), tmp_path)
    with pytest.raises(PveConfigError, match=r"<vmid>\.conf"):
        apply(conf_dir / "ct.conf", Want(NODES), tmp_path)
    assert list(conf_dir.iterdir()) == []


def test_raw_lxc_without_uvm_in_proc_devices_writes_nothing(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "fresh-pve8.conf")
    proc = tmp_path / "devices"
    proc.write_text("Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n")
    before = state(path)
    with pytest.raises(PveConfigError, match=r"nvidia-uvm is not in .*host_devices"):
        apply(path, raw(), tmp_path, proc_devices=proc)
    assert state(path) == before


def hold(lock: Path) -> int:
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_held_config_lock_times_out_cleanly(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "fresh-pve8.conf")
    before = state(path)
    fd = hold(tmp_path / "lock" / "pve-config-200.lock")
    try:
        with pytest.raises(pvecfg.LockTimeout, match="another tool holds"):
            apply(path, Want(NODES), tmp_path, timeout=0.2)
    finally:
        os.close(fd)
    assert state(path) == before
    assert sorted(p.name for p in conf_dir.iterdir()) == ["200.conf"]


def test_the_edit_waits_for_the_lock(conf_dir: Path, tmp_path: Path) -> None:
    path = place(conf_dir, "fresh-pve8.conf")
    before = state(path)
    fd = hold(tmp_path / "lock" / "pve-config-200.lock")
    results: list[pvecfg.Result] = []
    worker = threading.Thread(
        target=lambda: results.append(apply(path, Want(NODES), tmp_path, timeout=60))
    )
    worker.start()
    time.sleep(0.3)  # give the edit time to reach the lock; it must not write past it
    try:
        assert state(path) == before
        assert not results
    finally:
        os.close(fd)
    worker.join(60)
    assert results and results[0].plan.changed
    assert path.read_text() == results[0].plan.after


def test_a_failed_write_leaves_the_config_and_no_temp_file(
    conf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = place(conf_dir, "fresh-pve8.conf")
    before = state(path)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pvecfg.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        apply(path, Want(NODES), tmp_path)
    assert state(path) == before
    assert sorted(p.name for p in conf_dir.iterdir()) == ["200.conf"]


def test_bytes_that_are_not_utf8_survive(conf_dir: Path, tmp_path: Path) -> None:
    path = conf_dir / "200.conf"
    path.write_bytes(b"#caf\xe9 latin-1 comment\narch: amd64\n[snap]\n#\xff\xfe\n")
    apply(path, Want(("/dev/nvidia0",)), tmp_path)
    assert path.read_bytes() == (
        b"#caf\xe9 latin-1 comment\narch: amd64\ndev0: /dev/nvidia0,mode=0666\n[snap]\n#\xff\xfe\n"
    )


# --- generated configs -----------------------------------------------------------------------

PATHS = [*NODES, "/dev/nvidia-modeset", "/dev/dri/card0", "/dev/net/tun"]
KEYS = ["arch", "cores", "hostname", "memory", "net0", "onboot", "swap", "tags", "mp0", "ct_x"]
VALUES = st.text(alphabet="abcdefgh0123456789=,/:. -_", min_size=1, max_size=20).filter(
    lambda v: v.strip() == v
)
MAJORS = st.sampled_from([195, 238, 241, 226, 10, 509, 511, 250, 100])


def dev_line(i: int, path: str, mode: str) -> str:
    return f"dev{i}: {path},mode={mode}"


main_line = st.one_of(
    st.builds(lambda k, v: f"{k}: {v}", st.sampled_from(KEYS), VALUES),
    st.builds(lambda v: f"#{v}", st.text(max_size=20).filter(lambda t: "\n" not in t)),
    st.just(""),
    st.builds(
        dev_line, st.integers(0, 20), st.sampled_from(PATHS), st.sampled_from(["0666", "0660"])
    ),
    st.builds(
        lambda key, m, minor: f"{key}: c {m}:{minor} rwm",
        st.sampled_from([pvecfg.ALLOW_KEY, pvecfg.ALLOW_KEY_V1]),
        MAJORS,
        st.sampled_from(["*", "0", "255"]),
    ),
    st.builds(lambda p: f"lxc.mount.entry: {p} {p[1:]} {MOUNT}", st.sampled_from(PATHS)),
    st.builds(lambda v: f"lxc.apparmor.profile: {v}", VALUES),
)
section = st.builds(
    lambda name, body: f"[{name}]\n" + "".join(f"{ln}\n" for ln in body),
    st.sampled_from(["pve:pending", "snap1", "before-update", "Pre_Upgrade"]),
    st.lists(main_line, max_size=8),
)
config_text = st.builds(
    lambda main, sections, sep: "".join(f"{ln}\n" for ln in main) + sep + "".join(sections),
    st.lists(main_line, max_size=25),
    st.lists(section, max_size=3),
    st.sampled_from(["", "\n"]),
)
device_sets = st.lists(st.sampled_from((*NODES, "/dev/nvidia-caps/nvidia-cap1")), min_size=1)
proc_majors = st.builds(
    lambda uvm: {**H200_MAJORS, "nvidia-uvm": uvm},
    st.sampled_from([238, 509, 511]),
)


def managed_by_test(line: pvecfg.Line, devices: set[str], majors: set[int], live: set[int]) -> bool:
    """Which lines the editor may touch, stated independently of its code."""
    if re.fullmatch(r"dev\d+", line.key) and line.kind == "key":
        return line.value.split(",")[0].removeprefix("path=") in devices
    if line.kind != "lxc":
        return False
    if line.key == pvecfg.MOUNT_KEY:
        return (line.value.split() or [""])[0] in devices
    m = re.fullmatch(r"c (\d+):(\*|\d+) rwm", line.value)
    if line.key in (pvecfg.ALLOW_KEY, pvecfg.ALLOW_KEY_V1) and m:
        major = int(m.group(1))
        stale = m.group(2) == "*" and pvecfg.is_dynamic(major) and major not in live
        return major in majors or stale
    return False


@given(config_text, device_sets, st.sampled_from(pvecfg.PASSTHROUGH), proc_majors)
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_generated_configs(
    text: str, devices: list[str], mode: str, majors: dict[str, int]
) -> None:
    want = Want(tuple(devices), mode, majors=majors)
    before = pvecfg.parse(text)
    try:
        plan = pvecfg.plan(before, want)
    except PveConfigError as exc:
        # Raw lxc lines in [pve:pending] that would undo or double the passthrough.
        assert "[pve:pending] section" in str(exc)
        return
    after = pvecfg.parse(plan.after)
    if "[pve:pending]" in text:
        # The pending section is edited as PVE applies it: test_pvecfg_pending.py judges that.
        assert not pvecfg.plan(after, want).changed
        return
    # Everything after the main section, byte for byte.
    assert after.rest == before.rest and plan.after.endswith(before.rest)
    ours = {195} | {m for d in devices if (m := pvecfg.major_of(pvecfg.driver_of(d) or "", majors))}
    live = set(majors.values())
    dset = set(devices)

    # A devN key written twice: PVE reads the last line; when the editor removes that one (a
    # managed node), the earlier ones, hidden so far, go too rather than come to life.
    keys = Counter(ln.dev_index for ln in before.lines if ln.dev_index is not None)

    def unrelated(cfg: pvecfg.Config) -> list[str]:
        return [
            ln.text
            for ln in cfg.lines
            if not managed_by_test(ln, dset, ours, live) and keys[ln.dev_index] < 2
        ]

    # Every other line kept, in order.
    assert unrelated(after) == unrelated(before)
    managed = [ln for ln in after.lines if managed_by_test(ln, dset, ours, live)]
    if mode == "devn":
        # One entry per node, nothing else: no raw lines for these nodes or majors.
        assert all(ln.dev_index is not None for ln in managed)
        assert sorted(ln.value for ln in managed) == sorted(f"{d},mode=0666" for d in dset)
    else:
        assert all(ln.kind == "lxc" for ln in managed)
        need = {pvecfg.major_of(pvecfg.driver_of(d) or "", majors) for d in dset}
        allows = [ln for ln in managed if ln.key != pvecfg.MOUNT_KEY]
        assert sorted(int(ln.value.split()[1].split(":")[0]) for ln in allows) == sorted(need)
        assert all(ln.key == pvecfg.ALLOW_KEY and ":* " in ln.value for ln in allows)
        mounts = [ln.value.split()[0] for ln in managed if ln.key == pvecfg.MOUNT_KEY]
        assert sorted(mounts) == sorted(dset)
    # The editor adds no second line for a devN index (the config may have had some).
    count_before = Counter(ln.dev_index for ln in before.lines if ln.dev_index is not None)
    count_after = Counter(ln.dev_index for ln in after.lines if ln.dev_index is not None)
    assert all(n <= max(1, count_before[i]) for i, n in count_after.items())
    assert not pvecfg.plan(after, want).changed


# --- shipping it to the host -----------------------------------------------------------------


def test_module_utils_is_this_file() -> None:
    shipped = ROOT / "plugins/module_utils/ct200_pvecfg.py"
    assert shipped.resolve() == (ROOT / "ct200_tools/host/pvecfg.py").resolve()
    assert shipped.read_bytes() == (ROOT / "ct200_tools/host/pvecfg.py").read_bytes()


def test_pvecfg_is_stdlib_only_and_python39() -> None:
    source = (ROOT / "ct200_tools/host/pvecfg.py").read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def old_pythons() -> list[str]:
    """Python 3.9 interpreters that run here (a pyenv shim may exist without one behind it)."""
    found = []
    for p in [
        shutil.which("python3.9"),
        *map(str, Path.home().glob(".pyenv/versions/3.9*/bin/python3.9")),
    ]:
        if p and subprocess.run([p, "-c", ""], capture_output=True, check=False).returncode == 0:
            found.append(p)
    return found


OLD_PYTHONS = old_pythons()


@pytest.mark.skipif(not OLD_PYTHONS, reason="no Python 3.9 here (PVE 7's version)")
def test_pvecfg_runs_on_python39() -> None:
    script = (
        "import pvecfg;"
        "cfg = pvecfg.parse('arch: amd64\\n[snap]\\nx: 1\\n');"
        "p = pvecfg.plan(cfg, pvecfg.Want(('/dev/nvidia0',)));"
        "print(p.after, end='')"
    )
    proc = subprocess.run(
        [
            OLD_PYTHONS[0],
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT / 'ct200_tools' / 'host')!r}); {script}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "arch: amd64\ndev0: /dev/nvidia0,mode=0666\n[snap]\nx: 1\n"


# --- boot keys (onboot, startup) -------------------------------------------------------------

BOOT = (("onboot", "1"), ("startup", "order=1"))


def test_boot_keys_are_inserted_in_pve_order_without_a_restart() -> None:
    text = corpus("fresh-pve8.conf")
    want = Want(NODES, "devn", options=BOOT)
    first = edit(text, want)
    keys = [ln.key for ln in pvecfg.parse(first.after).lines if ln.kind == "key"]
    plain = [k for k in keys if not k.startswith("dev")]
    assert plain == sorted(plain)
    assert "onboot: 1" in first.managed and "startup: order=1" in first.managed
    assert first.passthrough_changed
    # Once the passthrough lines are there, a changed boot key alone needs no restart.
    again = edit(first.after.replace("onboot: 1", "onboot: 0"), want)
    assert again.changed and not again.passthrough_changed
    assert again.added == ("onboot: 1",) and again.removed == ("onboot: 0",)
    assert edit(first.after, want).after == first.after


def test_boot_keys_replace_in_place_and_drop_repeats() -> None:
    text = "arch: amd64\nstartup: order=5,up=30\nhostname: ct\nstartup: 3\n[snap]\nstartup: 9\n"
    got = edit(text, Want(NODES, "devn", options=(("startup", "order=1"),)))
    assert got.after.startswith("arch: amd64\nstartup: order=1\nhostname: ct\n")
    assert got.after.count("startup:") == 2  # the snapshot's own line is kept
    assert got.after.endswith("[snap]\nstartup: 9\n")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ((("onboot", "yes"),), "onboot"),
        ((("startup", "first"),), "startup"),
        ((("startup", ""),), "startup"),
        ((("memory", "1024"),), "memory"),
    ],
)
def test_bad_boot_keys_are_refused_naming_the_field(
    options: tuple[tuple[str, str], ...], field: str
) -> None:
    with pytest.raises(PveConfigError, match=field):
        edit(corpus("fresh-pve8.conf"), Want(NODES, "devn", options=options))


@pytest.mark.parametrize("value", ["1", "order=2", "order=1,up=30", "up=10,down=5", "2,down=60"])
def test_startup_values_pve_accepts(value: str) -> None:
    got = edit("arch: amd64\n", Want(NODES, "devn", options=(("startup", value),)))
    assert f"startup: {value}" in got.managed
