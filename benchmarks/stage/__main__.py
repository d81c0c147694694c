"""Measure restaging speed on cold caches, every contender on the same data in the same run.

Contenders (each copies the same safetensors-shaped shards from disk into DST, usually tmpfs):
  ct200-stage           parallel chunked copy with inline XXH3 verification (default options)
  ct200-stage-direct    the same with O_DIRECT reads (--read-mode direct)
  cp -r, rsync -a       what people use
  cat-parallel          N parallel `cat FILES > /dev/null`, one per file up to --jobs: the
                        disk-read limit (no writes at all)
  cat-sequential        one `cat` of every file in turn: one stream's read rate
  write-parallel        N parallel `dd if=/dev/zero` of the same sizes into DST: the write limit
                        (no reads at all; informational: where a copy can lose against cat)
Only with --only (where the time of a stage goes):
  ct200-read            the stage's reads and hashes without the writes (what a manifest costs)
  ct200-nodrop          the stage keeping the source's page cache (no POSIX_FADV_DONTNEED)
  ct200-nolock          the stage without its per-file write lock (as before issue 22): threads
                        writing one file wait for each other in the kernel, spinning
  ct200-buffer16M       the stage with the 16 MiB read buffer it used before issue 10
  ct200-jobsN           the stage with N threads instead of --jobs (e.g. ct200-jobs4)
  cat-parallel-again    cat-parallel once more in each round: two runs of one command, whose
                        ratio per round is the spread of the disk itself (an A/A pair)
  dd-nocache-parallel   cat-parallel with `dd iflag=nocache`, which drops the page cache behind
                        it as ct200-stage does: on a VM whose freed memory goes back to the host,
                        the read limit without the cost of touching new memory for the cache
  dd-streams            --jobs parallel `dd` reading equal byte ranges of the data: as many
                        streams as the stage's threads, so whether the disk serves that many
                        streams as well as one per file (no hashing, no writes)
  ct200-threadtime      the stage, timing its threads' calls: the report's thread_time says what
                        share of their wall time went to reads (disk waits included), hashing,
                        writes, dropping the cache, and the rest (write-lock waits, Python)
Then, on the staged copy in DST (tmpfs: no disk, no cache to drop):
  ct200-verify          ct200-stage verify DST
  xxhsum                xxhsum -H2 (XXH128, single-threaded) of the same files
  b3sum                 b3sum (BLAKE3, multi-threaded) of the same files, where installed
Before every copy: empty DST, sync, drop the page cache (echo 3 > /proc/sys/vm/drop_caches), and
wait --settle seconds: in a VM with free page reporting, memory freed just before a run is still
backed by the host for a moment, and a run that starts then touches cheap memory where the next
one, started later, pays the host's page faults. Waiting puts every run on the same footing: the
one after a reboot, where all memory is new.
Rounds rotate the order of contenders so that drifts in the disk or the host hit all of them alike;
the medians, and the ratio within each round, are reported, with each run's CPU time (user + sys
of the processes it started) per GB: on a machine with few cores, CPU is what a copy runs out of.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _cli
from ct200_tools.fsutil import write_atomic
from ct200_tools.stage.builder import build_manifest
from ct200_tools.stage.capacity import fs_type_of
from ct200_tools.stage.hashing import default_algorithm
from ct200_tools.stage.stager import default_jobs

CONTENDERS = (
    "ct200-stage",
    "ct200-stage-direct",
    "cp",
    "rsync",
    "cat-parallel",
    "cat-sequential",
    "write-parallel",
)
BREAKDOWN = (
    "cat-parallel-again",
    "ct200-read",
    "ct200-nodrop",
    "ct200-nolock",
    "ct200-buffer16M",
    "dd-nocache-parallel",
    "dd-streams",
    "ct200-threadtime",
)
VERIFIERS = ("ct200-verify", "xxhsum", "b3sum")
#: Contenders that need a tool that may not be installed.
TOOLS = {"rsync": "rsync", "xxhsum": "xxhsum", "b3sum": "b3sum"}
READ_ONLY = (
    "cat-parallel",
    "cat-sequential",
    "write-parallel",
    "ct200-read",
    "dd-nocache-parallel",
    "cat-parallel-again",
    "dd-streams",
)
BLOCK = 64 << 20


def parse_size(text: str) -> int:
    units = {"K": 10, "M": 20, "G": 30, "T": 40}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * (1 << units[text[-1]]))
    return int(text)


def args() -> argparse.Namespace:
    p = _cli.parser(
        None,
        runs=3,
        runs_flag="--rounds",
        runs_help="runs of each contender",
        out="directory for results.json and results.txt",
        out_required=True,
        prog="python3 -m benchmarks.stage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size", default="8G", help="total model size (default 8G)")
    p.add_argument("--shard-size", default="1G", help="size of each shard (default 1G)")
    p.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help=f"ct200-stage threads and parallel cats (default {default_jobs()})",
    )
    p.add_argument("--data", default="/var/tmp/ct200-bench-data", help="source dir (on disk)")
    p.add_argument("--dst", default="/dev/shm/ct200-bench", help="destination (tmpfs)")
    p.add_argument(
        "--only",
        default=",".join(CONTENDERS + VERIFIERS),
        help=f"comma-separated contenders (also: {', '.join(BREAKDOWN)})",
    )
    p.add_argument(
        "--remove-data", action="store_true", help="delete the generated data afterwards"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds to wait after dropping caches, so that a VM's freed memory has gone back "
        "to the host before every run alike (free page reporting waits 2 s) "
        "(default 5, 0 below 1 GiB)",
    )
    return p.parse_args()


def make_data(root: Path, size: int, shard: int) -> list[Path]:
    """Shards shaped like safetensors (8-byte header length, JSON header, tensor bytes) plus the
    small JSON files of a checkpoint; content is random so nothing compresses or dedups."""
    stamp = root / ".bench-shape"
    shape = f"{size} {shard}\n"
    if stamp.exists() and stamp.read_text() == shape:
        return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".bench-shape")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    n = max(1, -(-size // shard))
    base = bytearray(os.urandom(BLOCK))
    index = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        left = min(shard, size - i * shard)
        header = json.dumps({"__metadata__": {"format": "pt"}, "w": {"dtype": "BF16"}}).encode()
        with open(root / name, "wb") as fh:
            fh.write(len(header).to_bytes(8, "little") + header)
            left -= 8 + len(header)
            block = 0
            while left > 0:
                base[:16] = (i * 1_000_003 + block).to_bytes(16, "little")
                k = min(left, BLOCK)
                fh.write(memoryview(base)[:k])
                left -= k
                block += 1
        index[f"model.layers.{i}.weight"] = name
        print(f"  generated {name}", file=sys.stderr)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    (root / "config.json").write_text(json.dumps({"architectures": ["Bench"], "n": n}))
    (root / "tokenizer.json").write_text(json.dumps({"vocab": list(range(20000))}))
    subprocess.run(["sync"], check=False)
    stamp.write_text(shape)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".bench-shape")


def drop_caches() -> bool:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def command(
    name: str, src: Path, dst: Path, manifest: Path, jobs: int, files: list[Path]
) -> list[list[str]]:
    py = [sys.executable, "-m", "benchmarks.stage._stage_once"]
    stage = [*py, "stage", str(src), str(dst), str(manifest), str(jobs)]
    staged = [str(dst / f.relative_to(src)) for f in files]
    commands = {
        "ct200-stage": [stage],
        "ct200-stage-direct": [[*stage, "--direct"]],
        "ct200-nodrop": [[*stage, "--no-drop"]],
        "ct200-nolock": [[*stage, "--no-write-lock"]],
        "ct200-buffer16M": [[*stage, "--buffer", str(16 << 20)]],
        "ct200-threadtime": [[*stage, "--thread-times", str(thread_times(manifest))]],
        "ct200-read": [[*py, "read", str(src), str(manifest), str(jobs)]],
        "ct200-verify": [[*py, "verify", str(dst), str(jobs)]],
        "xxhsum": [["xxhsum", "-H2", *staged]],
        "b3sum": [["b3sum", *staged]],
        "cp": [["cp", "-r", str(src), str(dst)]],
        "rsync": [["rsync", "-a", f"{src}/", f"{dst}/"]],
        "cat-sequential": [["cat", *map(str, files)]],
    }
    if name in commands:
        return commands[name]
    if name.startswith("ct200-jobs"):
        return [[*py, "stage", str(src), str(dst), str(manifest), name.removeprefix("ct200-jobs")]]
    if name == "dd-streams":
        return [
            ["sh", "-c", _DD_RANGES, "dd", *(str(x) for triple in stream for x in triple)]
            for stream in streams(files, jobs)
        ]
    if name == "write-parallel":
        dst.mkdir(parents=True, exist_ok=True)
        return [
            [
                "dd",
                "if=/dev/zero",
                f"of={dst}/{i}",
                "bs=16M",
                f"count={-(-f.stat().st_size >> 24)}",
                "status=none",
            ]
            for i, f in enumerate(files)
        ]
    # cat- and dd-nocache-parallel: largest files first onto the least-loaded of `jobs` readers
    loads: list[tuple[int, list[str]]] = [(0, []) for _ in range(min(jobs, len(files)))]
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        i = min(range(len(loads)), key=lambda k: loads[k][0])
        loads[i] = (loads[i][0] + f.stat().st_size, [*loads[i][1], str(f)])
    if name == "dd-nocache-parallel":
        dd = 'for f; do dd if="$f" of=/dev/null bs=1M iflag=nocache status=none; done'
        return [["sh", "-c", dd, "dd", *fs] for _, fs in loads if fs]
    return [["sh", "-c", 'cat "$@" > /dev/null', "cat", *fs] for _, fs in loads if fs]


#: Reads each (file, offset, length) triple of its arguments in turn, with dd, in 1 MiB blocks.
_DD_RANGES = (
    'while [ "$#" -ge 3 ]; do dd if="$1" of=/dev/null bs=1M iflag=skip_bytes,count_bytes '
    'skip="$2" count="$3" status=none || exit 1; shift 3; done'
)


def streams(files: list[Path], jobs: int) -> list[list[tuple[Path, int, int]]]:
    """The data cut into `jobs` runs of equal bytes, in file order: per stream, its (file,
    offset, length) pieces (a stream may go on into the next file)."""
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    n = max(1, min(jobs, total))
    bounds = [total * k // n for k in range(n + 1)]
    out: list[list[tuple[Path, int, int]]] = []
    for lo, hi in itertools.pairwise(bounds):
        seg: list[tuple[Path, int, int]] = []
        base = 0
        for f, size in zip(files, sizes, strict=True):
            a, b = max(lo, base), min(hi, base + size)
            if a < b:
                seg.append((f, a - base, b - a))
            base += size
        if seg:
            out.append(seg)
    return out


def thread_times(manifest: Path) -> Path:
    """Where ct200-threadtime's run writes its thread times (beside the manifest, in --out)."""
    return manifest.with_name("thread-times.json")


def take_json(path: Path) -> dict[str, object]:
    """A file's JSON, the file removed (what a child left for us in --out)."""
    data: dict[str, object] = json.loads(path.read_text())
    path.unlink()
    return data


def run_once(cmds: list[list[str]]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + sys) of the processes and their children."""
    t0 = time.perf_counter()
    # xxhsum and b3sum draw progress on stderr; errors still show as a failed exit code.
    quiet = subprocess.DEVNULL if cmds[0][0] in ("xxhsum", "b3sum") else None
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=quiet) for c in cmds]
    cpu = 0.0
    codes = []
    for proc in procs:
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        codes.append(proc.returncode)
        cpu += usage.ru_utime + usage.ru_stime
    elapsed = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"{cmds[0][:3]} failed with {codes}")
    return elapsed, cpu


def copied_bytes(dst: Path) -> int:
    return sum(
        p.stat().st_size
        for p in dst.rglob("*")
        if p.is_file() and not p.name.startswith(".ct200-") and p.name != ".bench-shape"
    )


def select(only: str) -> tuple[list[str], list[str], list[str]]:
    """(copy contenders, verifiers, skipped for want of a tool) out of --only."""
    wanted = [c for c in only.split(",") if c]
    unknown = {c for c in wanted if not re.fullmatch(r"ct200-jobs\d+", c)}
    unknown -= set(CONTENDERS + BREAKDOWN + VERIFIERS)
    if unknown:
        sys.exit(f"unknown contenders: {', '.join(sorted(unknown))}")
    have = [c for c in wanted if c not in TOOLS or shutil.which(TOOLS[c])]
    skipped = sorted(set(wanted) - set(have))
    contenders = [c for c in have if c not in VERIFIERS]
    verifiers = [c for c in have if c in VERIFIERS]
    return contenders, verifiers, skipped


def sizes(a: argparse.Namespace) -> tuple[int, int]:
    """--size and --shard-size in bytes; exits with the reason when they are not sizes."""
    try:
        size, shard = parse_size(a.size), parse_size(a.shard_size)
    except ValueError:
        sys.exit(f"--size {a.size!r} / --shard-size {a.shard_size!r}: give bytes or 8G, 512M, ...")
    if size <= 0 or shard <= 0:
        sys.exit("--size and --shard-size must be above 0")
    return size, shard


def main() -> None:
    a = args()
    out = a.out
    size, shard = sizes(a)
    src, dst = Path(a.data), Path(a.dst)
    contenders, verifiers, skipped = select(a.only)
    free = shutil.disk_usage(dst.parent).free
    if free < size * 1.05:
        sys.exit(f"{dst.parent} has {free / 1e9:.1f} GB free; --size {a.size} needs more")
    print(f"data: {size / 1e9:.1f} GB in {a.shard_size} shards at {src}", file=sys.stderr)
    files = make_data(src, size, shard)
    total = sum(f.stat().st_size for f in files)
    cold = drop_caches()
    manifest_path = out / "manifest.json"
    t0 = time.perf_counter()
    manifest = build_manifest(str(src), "bench", jobs=a.jobs, lfs=False).manifest
    manifest_seconds = time.perf_counter() - t0
    write_atomic(str(manifest_path), manifest.to_json())

    runs: dict[str, list[float]] = {c: [] for c in contenders + verifiers}
    cpu: dict[str, list[float]] = {c: [] for c in contenders + verifiers}
    times: list[dict[str, object]] = []

    def timed(name: str, r: int) -> None:
        seconds, cpu_seconds = run_once(command(name, src, dst, manifest_path, a.jobs, files))
        runs[name].append(seconds)
        cpu[name].append(cpu_seconds)
        if name == "ct200-threadtime":
            times.append(take_json(thread_times(manifest_path)))
        print(
            f"  round {r + 1}: {name:<22} {total / seconds / 1e6:8.0f} MB/s, "
            f"cpu {cpu_seconds / (total / 1e9):.2f} s/GB",
            file=sys.stderr,
        )

    def save(rounds: int) -> str:
        # After every round: a run cut short (a time limit on a lent machine) keeps what it did.
        done = {c: v for c, v in runs.items() if len(v) == rounds}
        report = summarize(
            a, rounds, done, cpu, total, len(files), cold, skipped, manifest_seconds, src, dst
        )
        report.update(thread_time(times))
        text = render(report)
        _cli.write_results(out, report, text)
        return text

    for r in range(a.runs if contenders else 0):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for name in order:
            shutil.rmtree(dst, ignore_errors=True)
            cold = drop_caches() and cold
            time.sleep(a.settle if a.settle is not None else 5.0 if size >= 1 << 30 else 0.0)
            timed(name, r)
            if name not in READ_ONLY and copied_bytes(dst) != total:
                raise RuntimeError(f"{name} copied {copied_bytes(dst)} of {total} bytes")
        shutil.rmtree(dst, ignore_errors=True)
        save(r + 1)
    if verifiers:  # the staged copy is in RAM: nothing to drop between these
        run_once(command("ct200-stage", src, dst, manifest_path, a.jobs, files))
        for r in range(a.runs):
            for name in verifiers[r % len(verifiers) :] + verifiers[: r % len(verifiers)]:
                timed(name, r)
        shutil.rmtree(dst, ignore_errors=True)

    print(save(a.runs))
    if a.remove_data:  # kept by default: a rerun with the same shape reuses it
        shutil.rmtree(src, ignore_errors=True)


def summarize(
    a: argparse.Namespace,
    rounds: int,
    runs: dict[str, list[float]],
    cpu: dict[str, list[float]],
    total: int,
    nfiles: int,
    cold: bool,
    skipped: list[str],
    manifest_seconds: float,
    src: Path,
    dst: Path,
) -> dict[str, object]:
    rates = {c: [total / s / 1e6 for s in secs] for c, secs in runs.items()}
    med = {c: statistics.median(v) for c, v in rates.items()}
    ratios: dict[str, object] = {}
    pairs = [("ct200-stage", b) for b in ("cat-parallel", "cat-sequential", "cp", "rsync")]
    jobs_variants = tuple(c for c in rates if c.startswith("ct200-jobs"))
    pairs += [(c, "cat-parallel") for c in (*BREAKDOWN, *jobs_variants, "ct200-stage-direct")]
    pairs += [("ct200-verify", "xxhsum"), ("ct200-verify", "b3sum")]
    bases = dict(rates)
    if {"cat-parallel", "write-parallel"} <= set(rates):
        # A copy can go no faster than the slower of reading the source and writing the target.
        pair = zip(rates["cat-parallel"], rates["write-parallel"], strict=True)
        bases["min(cat-parallel,write-parallel)"] = [min(x, y) for x, y in pair]
        pairs.append(("ct200-stage", "min(cat-parallel,write-parallel)"))
    for mine, base in pairs:
        if mine in rates and base in bases:
            per_round = [x / y for x, y in zip(rates[mine], bases[base], strict=True)]
            ratios[f"{mine}/{base}"] = {
                "of_medians": round(med[mine] / statistics.median(bases[base]), 3),
                "per_round": [round(x, 3) for x in per_round],
                "median_per_round": round(statistics.median(per_round), 3),
            }
    return {
        "schema_version": 1,
        "bytes": total,
        "files": nfiles,
        "jobs": a.jobs,
        "rounds": rounds,
        "cold_caches": cold,
        "hash": default_algorithm(),
        "manifest_build_mb_per_s": round(total / manifest_seconds / 1e6),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "src_fs": fs_type_of(str(src)),
            "dst_fs": fs_type_of(str(dst.parent)),
        },
        "skipped": skipped,
        "mb_per_s": {
            c: {"median": round(med[c]), "runs": [round(x) for x in v]} for c, v in rates.items()
        },
        "cpu_s_per_gb": {
            c: round(statistics.median(v) / (total / 1e9), 3)
            for c, v in cpu.items()
            if v and c in runs
        },
        "ratios": ratios,
        "command": " ".join([sys.executable, "-m", "benchmarks.stage", *sys.argv[1:]]),
    }


def thread_time(times: list[dict[str, object]]) -> dict[str, object]:
    """The report's thread_time (none without ct200-threadtime runs): the median share of each
    part over the runs, and every run's figures."""
    if not times:
        return {}
    shares: list[dict[str, float]] = [t["share"] for t in times]  # type: ignore[misc]
    median = {p: round(statistics.median(s[p] for s in shares), 3) for p in shares[0]}
    return {"thread_time": {"median_share": median, "runs": times}}


def render(r: dict[str, object]) -> str:
    mb = r["mb_per_s"]
    assert isinstance(mb, dict)
    lines = [
        f"ct200-stage benchmark: {r['bytes'] / 1e9:.2f} GB in {r['files']} files, "  # type: ignore[operator]
        f"jobs {r['jobs']}, {r['rounds']} rounds, hash {r['hash']}, "
        f"caches {'dropped' if r['cold_caches'] else 'NOT dropped (not root?)'}",
        f"machine: {r['machine']}",
        "",
        f"{'contender':<22} {'median MB/s':>12} {'CPU s/GB':>9}  runs",
    ]
    cpu = r["cpu_s_per_gb"]
    assert isinstance(cpu, dict)
    for c, v in mb.items():
        lines.append(f"{c:<22} {v['median']:>12} {cpu.get(c, 0):>9.3f}  {v['runs']}")
    lines.append(f"{'(manifest, hash only)':<22} {r['manifest_build_mb_per_s']:>12}")
    if "thread_time" in r:
        share = r["thread_time"]["median_share"]  # type: ignore[index]
        parts = ", ".join(f"{k} {v:.0%}" for k, v in share.items())
        lines.append(f"ct200-threadtime, share of the threads' wall time (median): {parts}")
    lines.append("")
    ratios = r["ratios"]
    assert isinstance(ratios, dict)
    for k, v in ratios.items():
        lines.append(f"{k:<46} {v['of_medians']:>6}x  per round {v['per_round']}")
    if r["skipped"]:
        lines.append(f"skipped (not installed): {', '.join(r['skipped'])}")  # type: ignore[arg-type]
    lines.append(f"reproduce: {r['command']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
