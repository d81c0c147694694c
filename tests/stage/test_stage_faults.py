"""Faults with real processes: kill -9 at random points, then rerun; two stages at once."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ct200_tools.stage import tree
from ct200_tools.stage.errors import LockBusyError
from ct200_tools.stage.lock import holder_pid, target_lock
from ct200_tools.stage.status import model_status

from .conftest import (
    assert_never_half_done,
    cli,
    make_model,
    stage_argv,
    tree_bytes,
    write_manifest,
)

KILLS = 8


def test_kill_9_at_random_points_then_rerun(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=6, shard_size=8 << 20)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    partial = Path(tree.partial_path(str(dst)))
    rng = random.Random(20240601)  # noqa: S311 - kill timing, not cryptography
    # How long the copy itself takes here, so that kills are spread over it.
    first = subprocess.run(stage_argv(src, dst, mpath), capture_output=True, text=True, check=True)
    window = max(0.02, 1.2 * json.loads(first.stdout)["result"]["seconds"])
    shutil.rmtree(dst)
    landed = {"before-copy": 0, "mid-copy": 0, "finished": 0}
    journaled: list[int] = []
    for _ in range(KILLS):
        proc = subprocess.Popen(
            stage_argv(src, dst, mpath, "--read-mode", rng.choice(["auto", "buffered"])),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, window))
        if proc.poll() is None:
            landed["mid-copy" if partial.exists() else "before-copy"] += 1
            os.kill(proc.pid, signal.SIGKILL)
        else:
            landed["finished"] += 1
        proc.wait()
        assert_never_half_done(dst)
        state = tree.Journal(str(partial)).read()
        journaled.append(len(state.files) + sum(len(c) for c in state.chunks.values()))
        if dst.exists():  # it won the race: start over so the next kill lands in a copy again
            shutil.rmtree(dst)
    assert landed["mid-copy"] >= KILLS // 2, landed
    assert any(n > 0 for n in journaled), journaled  # some kills hit between verified files
    done = subprocess.run(stage_argv(src, dst, mpath), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["result"]
    assert summary["outcome"] == "staged"
    assert model_status(str(dst), deep=True, manifest=str(mpath)).state == "staged"
    assert tree_bytes(dst) == tree_bytes(src)
    assert not partial.exists()


def test_two_stages_of_one_model_do_not_interleave(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=4, shard_size=8 << 20)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    procs = [
        subprocess.Popen(
            stage_argv(src, dst, mpath), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    outcomes = sorted(
        json.loads(out)["result"]["outcome"] if rc == 0 else json.loads(out)["error"]["kind"]
        for rc, out, _err in results
    )
    # One copies; the other either saw it busy (exit 2, "another stage") or found it done.
    assert outcomes in (["busy", "staged"], ["already-staged", "staged"]), results
    for rc, _out, err in results:
        assert "Traceback" not in err
        if rc != 0:
            assert rc == 2 and "another stage of" in err and "pid" in err
    assert model_status(str(dst), deep=True).state == "staged"
    # Queued with --wait, both succeed and exactly one copies.
    shutil.rmtree(dst)
    procs = [
        subprocess.Popen(
            stage_argv(src, dst, mpath, "--wait", "60"), stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(o["ok"] for o in outs)
    assert sorted(o["result"]["outcome"] for o in outs) == ["already-staged", "staged"]
    assert model_status(str(dst), deep=True).state == "staged"


def test_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    target = tmp_path / "t"
    with target_lock(str(target), "t"):
        assert holder_pid(str(target)) == os.getpid()
        with (
            pytest.raises(LockBusyError, match=f"pid {os.getpid()}"),
            target_lock(str(target), "t"),
        ):
            pass
    assert holder_pid(str(target)) is None
    # A holder killed with SIGKILL leaves no stale lock behind.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ct200_tools.stage.lock import target_lock\n"
            f"with target_lock({str(target)!r}, 't'):\n  print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert holder_pid(str(target)) == holder.pid
    holder.kill()
    holder.wait()
    with target_lock(str(target), "t"):
        pass


def test_cli_reports_busy_without_traceback(tmp_path: Path, shm: Path) -> None:
    src = make_model(tmp_path / "src", shards=1)
    mpath = tmp_path / "m.json"
    write_manifest(src, mpath)
    dst = shm / "m"
    with target_lock(str(dst), "m"):
        res = cli("stage", str(src), str(dst), "--manifest", str(mpath))
    assert res.returncode == 2
    assert "another stage" in res.stderr and "Traceback" not in res.stderr
    assert "fix:" in res.stderr
