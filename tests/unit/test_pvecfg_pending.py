"""ct200_tools/host/pvecfg.py judged by what PVE will start the container with: every edit read back
through tests/unit/pve_reader.py (pve-container's parse and pending-apply, written from its
Perl source), so a pending change, a mode PVE refuses, a symlinked or CRLF config cannot make
the module report nodes the container will not get (issue 20, class 5)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ct200_tools.host import pvecfg
from ct200_tools.host.pvecfg import PveConfigError, Want
from tests.unit import pve_reader
from tests.unit.test_pvecfg import (
    CORPUS,
    H200_MAJORS,
    H200_PROC,
    NODES,
    config_text,
    managed_by_test,
    proc_majors,
)

GPU = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
MAIN = """\
arch: amd64
cores: 16
dev0: /dev/nvidia0,mode=0666
dev1: /dev/nvidiactl,mode=0666
dev2: /dev/nvidia-uvm,mode=0666
hostname: ct201
memory: 262144
ostype: debian
rootfs: local-lvm:vm-201-disk-0,size=64G
swap: 512
"""


def edit(text: str, want: Want) -> pvecfg.Plan:
    return pvecfg.plan(pvecfg.parse(text), want)


def started(text: str) -> pve_reader.Section:
    return pve_reader.at_next_start(text)


def assert_each_node_once(text: str, nodes: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Every wanted node exactly once when the container starts, with a mode PVE accepts
    (parse_device raises otherwise); returns the entries by node."""
    conf = started(text)
    counts = pve_reader.node_counts(conf, set(nodes))
    assert {n: counts[n] for n in nodes} == dict.fromkeys(nodes, 1), counts
    return {d["path"]: d for d in pve_reader.devices(conf, set(nodes)).values()}


# --- [pve:pending] ---------------------------------------------------------------------------


def test_reader_applies_pending_as_pve_does() -> None:
    """The stand-in itself, on the corpus config with a pending change."""
    text = (CORPUS / "pending-devn.conf").read_text()
    conf = started(text)
    assert conf.keys["cores"] == "32"  # pending replaces main
    assert "swap" not in conf.keys  # delete: swap
    assert conf.keys["dev3"] == "/dev/nvidia-uvm-tools,mode=0666"
    with pytest.raises(pve_reader.PveRefuses, match="0\\[0-7\\]"):
        pve_reader.parse_device("/dev/nvidia0,mode=666")


def test_pending_delete_of_an_index_the_module_keeps() -> None:
    """`pct set` takes a key it sets off the pending delete list; so does the module."""
    text = MAIN + "\n[pve:pending]\ndelete: dev2,swap\n"
    plan = edit(text, Want(GPU))
    assert plan.changed and not plan.added and not plan.removed
    assert "\n[pve:pending]\ndelete: swap\n" in plan.after
    assert plan.pending_removed == ("delete: dev2,swap",)
    assert plan.pending_added == ("delete: swap",)
    # The running container has the node: no restart for a pending-only edit.
    assert not plan.passthrough_changed
    assert_each_node_once(plan.after, GPU)
    assert "swap" not in started(plan.after).keys  # the admin's own deletion stays
    assert not edit(plan.after, Want(GPU)).changed


def test_pending_delete_of_the_only_key_goes_with_its_line() -> None:
    text = MAIN + "\n[pve:pending]\ndelete: !dev0\ncores: 32\n"
    plan = edit(text, Want(GPU))
    assert plan.after == MAIN + "\n[pve:pending]\ncores: 32\n"
    assert_each_node_once(plan.after, GPU)


def test_a_new_entry_avoids_an_index_pending_deletes() -> None:
    text = MAIN.replace("dev2: /dev/nvidia-uvm,mode=0666\n", "") + "\n[pve:pending]\ndelete: dev2\n"
    plan = edit(text, Want(GPU))
    assert plan.added == ("dev3: /dev/nvidia-uvm,mode=0666",)
    assert_each_node_once(plan.after, GPU)


def test_pending_devn_for_a_node_the_module_writes_is_set_like_pct_set() -> None:
    """A pending dev5 for /dev/nvidia0 beside main's dev0: both would be created at the next
    start (the start fails). The module sets dev5 in main, as `pct set -dev5` would, keeping
    its gid; dev0 goes."""
    text = MAIN + "\n[pve:pending]\ndev5: /dev/nvidia0,mode=0660,gid=44\ndelete: dev5;swap\n"
    plan = edit(text, Want(GPU))
    entries = assert_each_node_once(plan.after, GPU)
    assert entries["/dev/nvidia0"] == {"path": "/dev/nvidia0", "mode": "0666", "gid": "44"}
    assert "dev5: /dev/nvidia0,mode=0666,gid=44" in plan.added
    assert "dev0: /dev/nvidia0,mode=0666" in plan.removed
    assert plan.pending_removed == ("dev5: /dev/nvidia0,mode=0660,gid=44", "delete: dev5;swap")
    assert plan.after.endswith("\n[pve:pending]\ndelete: swap\n")
    assert not edit(plan.after, Want(GPU)).changed


def test_a_pending_devn_naming_the_node_another_way_is_the_same_node() -> None:
    """PVE creates /dev//nvidia0 and path=/dev/nvidia0 as the same node as /dev/nvidia0."""
    text = MAIN + "\n[pve:pending]\ndev7: path=/dev//nvidia0,mode=0666\n"
    plan = edit(text, Want(GPU))
    conf = started(plan.after)
    paths = [re.sub("/+", "/", d["path"]) for d in pve_reader.devices(conf).values()]
    assert sorted(paths) == sorted(GPU)


def test_pending_devn_for_a_node_main_lacks() -> None:
    text = MAIN + "\n[pve:pending]\ndev3: /dev/nvidia1,mode=0666\n"
    want = Want((*GPU, "/dev/nvidia1"))
    plan = edit(text, want)
    assert_each_node_once(plan.after, want.devices)
    assert "dev3: /dev/nvidia1,mode=0666" in plan.added
    # The section keeps its header; PVE reads it as no pending change.
    assert plan.after.endswith("[pve:pending]\n")


def test_pending_value_replacing_a_managed_entry_moves_the_node() -> None:
    """pending dev2 is another device: at the next start it replaces main's dev2 (nvidia-uvm),
    so the node needs an index of its own."""
    text = MAIN + "\n[pve:pending]\ndev2: /dev/dri/renderD128,gid=104\n"
    plan = edit(text, Want(GPU))
    assert_each_node_once(plan.after, GPU)
    assert started(plan.after).keys["dev2"] == "/dev/dri/renderD128,gid=104"
    assert plan.after.endswith("[pve:pending]\ndev2: /dev/dri/renderD128,gid=104\n")


def test_a_hidden_duplicate_key_does_not_count() -> None:
    """PVE keeps the last line of a key: an earlier dev1 for the node is not what it reads."""
    text = "arch: amd64\ndev1: /dev/nvidia0,mode=0666\ndev1: /dev/dri/card0\n"
    plan = edit(text, Want(("/dev/nvidia0",)))
    assert_each_node_once(plan.after, ("/dev/nvidia0",))
    assert started(plan.after).keys["dev1"] == "/dev/dri/card0"


def test_raw_lines_in_pending_are_refused_in_raw_lxc_mode() -> None:
    text = MAIN + "\n[pve:pending]\nlxc.apparmor.profile: unconfined\n"
    with pytest.raises(PveConfigError, match=r"\[pve:pending\].*lxc\.\*"):
        edit(text, Want(GPU, "raw-lxc", majors=H200_MAJORS))
    # devn: raw lines that do not pass a managed node are no concern.
    assert_each_node_once(edit(text, Want(GPU)).after, GPU)
    mount = "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
    with pytest.raises(PveConfigError, match="passed twice"):
        edit(MAIN + "\n[pve:pending]\n" + mount, Want(GPU))


def test_only_the_last_pending_section_counts() -> None:
    text = MAIN + "\n[pve:pending]\ndelete: dev0\n[snap]\nx: 1\n[PVE:PENDING]\ndelete: dev1\n"
    plan = edit(text, Want(GPU))
    assert_each_node_once(plan.after, GPU)
    assert "[pve:pending]\ndelete: dev0\n[snap]\nx: 1\n[PVE:PENDING]\n" in plan.after


# --- devN entries PVE accepts ----------------------------------------------------------------


def test_mode_666_is_written_as_0666() -> None:
    text = "arch: amd64\ndev0: /dev/nvidia0,mode=666\ndev1: path=/dev/nvidiactl,mode=666\n"
    plan = edit(text, Want(("/dev/nvidia0", "/dev/nvidiactl")))
    entries = assert_each_node_once(plan.after, ("/dev/nvidia0", "/dev/nvidiactl"))
    assert {e["mode"] for e in entries.values()} == {"0666"}
    assert plan.replaced == (
        ("dev0: /dev/nvidia0,mode=666", "dev0: /dev/nvidia0,mode=0666"),
        ("dev1: path=/dev/nvidiactl,mode=666", "dev1: path=/dev/nvidiactl,mode=0666"),
    )


def test_admin_uid_and_gid_are_kept_and_shown() -> None:
    text = "arch: amd64\ndev0: /dev/nvidia0,uid=1000,mode=0660,gid=44\ndev1: /dev/nvidiactl\n"
    plan = edit(text, Want(("/dev/nvidia0", "/dev/nvidiactl")))
    entries = assert_each_node_once(plan.after, ("/dev/nvidia0", "/dev/nvidiactl"))
    assert entries["/dev/nvidia0"] == {
        "path": "/dev/nvidia0",
        "uid": "1000",
        "mode": "0666",
        "gid": "44",
    }
    assert plan.added == (
        "dev0: /dev/nvidia0,uid=1000,mode=0666,gid=44",
        "dev1: /dev/nvidiactl,mode=0666",
    )
    assert "dev0: /dev/nvidia0,uid=1000,mode=0666,gid=44" in plan.managed


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/dev/nvidia0,gid=video", "gid must be a number"),
        ("/dev/nvidia0,mode=0666,mode=0660", "mode is given twice"),
        ("/dev/nvidia0,owner=1", "unknown option 'owner'"),
        ("/dev/nvidia0,deny-write=maybe", "deny-write must be"),
    ],
)
def test_a_managed_entry_pve_refuses_is_refused(value: str, why: str) -> None:
    with pytest.raises(PveConfigError, match=re.escape(why)):
        edit(f"arch: amd64\ndev0: {value}\n", Want(("/dev/nvidia0",)))


def test_deny_write_goes_from_a_managed_entry() -> None:
    plan = edit("dev0: /dev/nvidia0,deny-write=1,mode=0666\n", Want(("/dev/nvidia0",)))
    assert plan.after == "dev0: /dev/nvidia0,mode=0666\n"


# --- line ends -------------------------------------------------------------------------------


def test_a_crlf_config_stays_crlf() -> None:
    crlf = (MAIN + "\n[pve:pending]\ndelete: dev2,swap\ndev7: /dev/nvidia1,mode=666\n").replace(
        "\n", "\r\n"
    )
    want = Want((*GPU, "/dev/nvidia1", "/dev/nvidia-uvm-tools"), options=(("onboot", "1"),))
    plan = edit(crlf, want)
    assert plan.changed
    assert "\n" not in plan.after.replace("\r\n", "")
    assert_each_node_once(plan.after, want.devices)
    assert "dev7: /dev/nvidia1,mode=0666\r\n" in plan.after
    assert plan.after.endswith("[pve:pending]\r\ndelete: swap\r\n")
    # Reported lines carry no carriage return.
    assert not any("\r" in t for t in (*plan.added, *plan.managed, *plan.pending_removed))
    assert not edit(plan.after, want).changed


# --- generated configs -----------------------------------------------------------------------

DEV_INDEXES = st.lists(st.integers(0, 20).map(lambda i: f"dev{i}"), max_size=4)
pending_section = st.builds(
    lambda lines, dels, sep: (
        "[pve:pending]\n"
        + "".join(f"{ln}\n" for ln in lines)
        + (f"delete: {sep.join([*dels, 'swap'])}\n" if dels else "")
    ),
    st.lists(
        st.builds(
            lambda i, p, m: f"dev{i}: {p},mode={m}",
            st.integers(0, 20),
            st.sampled_from([*NODES, "/dev/dri/card0"]),
            st.sampled_from(["0666", "0660", "666"]),
        ),
        max_size=4,
    ),
    DEV_INDEXES,
    st.sampled_from([",", ";", " "]),
)
with_pending = st.builds(
    lambda text, section, crlf: (text + section).replace("\n", "\r\n" if crlf else "\n"),
    config_text,
    pending_section,
    st.booleans(),
)
device_sets = st.lists(st.sampled_from(NODES), min_size=1, unique=True)


def unmanaged(conf: pve_reader.Section, nodes: set[str]) -> dict[str, str]:
    """The started container's keys the module must not change: every key but the devN
    entries of managed nodes (and the boot keys, not set here)."""
    out = {}
    for key, value in conf.keys.items():
        if re.fullmatch(r"dev\d+", key) and pvecfg._dev_opts(value).get("path") in nodes:
            continue
        out[key] = value
    return out


@given(with_pending, device_sets, proc_majors)
@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_generated_configs_start_with_each_node_once(
    text: str, devices: list[str], majors: dict[str, int]
) -> None:
    want = Want(tuple(devices), "devn", majors=majors)
    try:
        plan = edit(text, want)
    except PveConfigError as exc:
        # Only a managed node's raw mount in the pending section is refused in devn mode.
        assert "passed twice" in str(exc)
        return
    nodes = set(devices)
    before = started(text)
    after = started(plan.after)
    # Main-section lines other than devN entries and managed raw lines: kept, in order.
    ours = {195} | {m for d in devices if (m := pvecfg.major_of(pvecfg.driver_of(d) or "", majors))}

    def other(cfg: pvecfg.Config) -> list[str]:
        return [
            ln.text
            for ln in cfg.lines
            if ln.dev_index is None and not managed_by_test(ln, nodes, ours, set(majors.values()))
        ]

    assert other(pvecfg.parse(plan.after)) == other(pvecfg.parse(text))
    entries = assert_each_node_once(plan.after, tuple(devices))
    assert all(e["mode"] == "0666" for e in entries.values())
    assert unmanaged(after, nodes) == unmanaged(before, nodes)
    # The snapshots are kept; CRLF stays CRLF.
    assert (
        pve_reader.parse_pct_config(plan.after).snapshots
        == pve_reader.parse_pct_config(text).snapshots
    )
    if "\r\n" in text and "\n" not in text.replace("\r\n", ""):
        assert "\n" not in plan.after.replace("\r\n", "")
    assert not edit(plan.after, want).changed


@given(with_pending, device_sets, proc_majors)
@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_generated_configs_raw_lxc(text: str, devices: list[str], majors: dict[str, int]) -> None:
    want = Want(tuple(devices), "raw-lxc", majors=majors)
    try:
        plan = edit(text, want)
    except PveConfigError as exc:
        assert "[pve:pending] section has raw lxc" in str(exc)
        return
    conf = started(plan.after)
    assert unmanaged(conf, set(devices)) == unmanaged(started(text), set(devices))
    counts = pve_reader.node_counts(conf, set(devices))
    assert {n: counts[n] for n in devices} == dict.fromkeys(devices, 1)
    # Passed by bind mounts alone: no devN entry for them at the next start.
    assert not pve_reader.devices(conf, set(devices))
    assert not edit(plan.after, want).changed


# --- the file: symlinks and other non-files --------------------------------------------------


def apply(path: Path, tmp_path: Path, *, check: bool = False) -> pvecfg.Result:
    return pvecfg.apply(
        str(path),
        Want(NODES),
        check=check,
        proc_devices=str(H200_PROC),
        lock_dir=str(tmp_path / "lock"),
        timeout=5,
    )


@pytest.mark.parametrize("check", [False, True])
def test_a_symlinked_config_is_refused_and_nothing_moves(tmp_path: Path, check: bool) -> None:
    conf_dir = tmp_path / "lxc"
    conf_dir.mkdir()
    target = tmp_path / "real.conf"
    target.write_text(MAIN)
    link = conf_dir / "200.conf"
    link.symlink_to(target)
    before = (target.read_bytes(), target.stat().st_ino, target.stat().st_mtime_ns)
    with pytest.raises(PveConfigError, match=r"200\.conf is a symbolic link.*Changed nothing"):
        apply(link, tmp_path, check=check)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target.read_bytes(), target.stat().st_ino, target.stat().st_mtime_ns) == before
    assert sorted(p.name for p in conf_dir.iterdir()) == ["200.conf"]
    # A dangling link is a link too, not a missing container.
    target.unlink()
    with pytest.raises(PveConfigError, match="symbolic link"):
        apply(link, tmp_path, check=check)


@pytest.mark.timeout(20)  # a blocking open would hang here
def test_a_fifo_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    conf_dir = tmp_path / "lxc"
    conf_dir.mkdir()
    fifo = conf_dir / "200.conf"
    os.mkfifo(fifo)
    with pytest.raises(PveConfigError, match="not a regular file"):
        apply(fifo, tmp_path, check=True)


@pytest.mark.timeout(20)  # a blocking open would hang here
def test_a_fifo_as_proc_devices_is_refused_without_blocking(tmp_path: Path) -> None:
    conf_dir = tmp_path / "lxc"
    conf_dir.mkdir()
    path = conf_dir / "200.conf"
    path.write_text(MAIN)
    fifo = tmp_path / "devices"
    os.mkfifo(fifo)
    with pytest.raises(PveConfigError, match="not a regular file"):
        pvecfg.apply(
            str(path),
            Want(GPU, "raw-lxc"),
            check=True,
            proc_devices=str(fifo),
            lock_dir=str(tmp_path / "lock"),
        )


def test_an_oversized_config_is_refused(tmp_path: Path) -> None:
    conf_dir = tmp_path / "lxc"
    conf_dir.mkdir()
    big = conf_dir / "200.conf"
    big.write_text("#" + "x" * pvecfg.MAX_CONFIG_BYTES + "\n")
    with pytest.raises(PveConfigError, match="larger than"):
        apply(big, tmp_path, check=True)


def test_apply_writes_the_pending_edit(tmp_path: Path) -> None:
    conf_dir = tmp_path / "lxc"
    conf_dir.mkdir()
    path = conf_dir / "200.conf"
    path.write_bytes((MAIN + "\n[pve:pending]\ndelete: dev1,swap\n").replace("\n", "\r\n").encode())
    result = pvecfg.apply(
        str(path), Want(GPU), proc_devices=str(H200_PROC), lock_dir=str(tmp_path / "lock")
    )
    assert result.plan.pending_removed == ("delete: dev1,swap",)
    data = path.read_bytes()
    assert data.endswith(b"[pve:pending]\r\ndelete: swap\r\n")
    assert_each_node_once(data.decode(), GPU)
