"""The benchmark day on the lent GPU machine, in one command per device call (it has no network,
no systemd as PID 1, and a call may run 10 minutes).

Builds llama-server with CUDA from the carried source once (tests/gpu/llama_cuda.py, cached
under /tmp: about 4.5 min on 16 cores), writes the 1.5 GB random-weight model once, and for
each serving set of examples/benchmark-day/site.yml (made concrete by sets.machine_raw: this
binary, this GPU, the model's persistent copy under WORK) runs tests/gpu/unit_run.py: the
models staged, the rendered unit's ExecStartPre (preflight, `ct200-doctor gate`), ExecStart with
the unit's environment, ExecStartPost (wait-ready), the doctor's server checks, then the set's
plan (the day's, one set) with `ct200-bench run PLAN --target URL --out WORK/results`. Every
call then writes the report of all the sets measured so far (`--baseline ar`), compiles its
speedup.tex with pdflatex when the machine has it, and packs results, report and each set's
unit run into --out/day.tar.gz.

After `bash tests/gpu/carry_llama.sh` here, with the device tool (carry .gpu-carry), calls
within one warm machine, each under 10 minutes (benchmarks/day/README.md; `--build-only` also
writes the binary into $OUT, for later calls to carry instead of building):

    python3 benchmarks/day/gpu.py --out $OUT --sets ar,draft-self-4,draft-self-8
    python3 benchmarks/day/gpu.py --out $OUT --sets synth-2
    python3 benchmarks/day/gpu.py --out $OUT --sets synth-4,ngram

The plan is sized to a device session (SIZE below: fresh chat prompts only, 32 requests of 128
tokens a point, every level of 1..32, 3 repetitions); `--full` runs the plan as written (both
workloads, 64 requests of 256 tokens), a day's work rather than a session's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gpu.carried import use_carried_wheels  # noqa: E402

#: domain.md section 9: 8 layers, hidden 2048, FFN 5632, about 1.5 GB of f32.
SHAPE = {"layers": 8, "hidden": 2048, "heads": 16, "ffn": 5632}
MODEL = "day-1p5b"
#: A device session's share of the day: fresh chat prompts (the dataset has 18 entries, which a
#: sweep would repeat: cached), shorter answers, a bound on every point.
SIZE: dict[str, Any] = {
    "workloads": [
        {"name": "chat-fresh", "endpoint": "chat", "input_tokens": 128, "output_tokens": 128,
         "requests": 32},
    ],
    "max_seconds": 30,
    "warmup": 2,
}  # fmt: skip
#: The day cut to what a tests/gpu test affords (tests/gpu/test_day.py): two loads, two
#: repetitions (a noise), short answers.
SMOKE: dict[str, Any] = {
    "workloads": [
        {"name": "chat-fresh", "endpoint": "chat", "input_tokens": 64, "output_tokens": 64,
         "requests": 8},
    ],
    "concurrency": [1, 4],
    "repetitions": 2,
    "max_seconds": 30,
    "warmup": 1,
}  # fmt: skip
SIZES = {"session": SIZE, "smoke": SMOKE}
#: The port of the earlier GPU runs (tests/gpu), away from the usual 8080.
PORT = 18180


def model_dir(work: Path) -> Path:
    """The model's persistent copy (its `source`), written once per machine."""
    from testbed import tiny_gguf  # noqa: PLC0415 - gguf comes from the carried wheels

    src = work / "models" / MODEL
    path = src / "model.gguf"
    if not path.is_file():
        src.mkdir(parents=True, exist_ok=True)
        part = tiny_gguf.write(src / "model.gguf.part", shape=tiny_gguf.Shape(**SHAPE), name=MODEL)
        part.rename(path)
    return src


def measure(work: Path, site: Path, name: str, size: dict[str, Any] | None) -> dict[str, Any]:
    from benchmarks.day import sets  # noqa: PLC0415

    plan = sets.write_plan(work / f"plan-{name}.yml", sets.set_plan(name, size))
    sweep = [sys.executable, "-m", "ct200_tools.cli.bench", "run", str(plan), "--target", "{url}",
             "--out", str(work / "results")]  # fmt: skip
    report = work / f"unit-{name}.json"
    argv = [sys.executable, "-m", "tests.gpu.unit_run", "--site", str(site), "--server", name,
            "--report", str(report), "--sweep", json.dumps(sweep)]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(argv, cwd=ROOT, check=False)
    got: dict[str, Any] = json.loads(report.read_text()) if report.is_file() else {}
    pre = [(p["argv"][1:3], p["rc"]) for p in got.get("exec_start_pre", [])]
    post, swept = got.get("exec_start_post", {}).get("rc"), got.get("sweep", {}).get("rc")
    print(
        f"{name}: {time.monotonic() - t0:.0f} s; ExecStartPre {pre}; wait-ready rc {post}; "
        f"sweep rc {swept}; error {got.get('error')}",
        flush=True,
    )
    if got.get("sweep", {}).get("rc") not in (0, None):
        print(got["sweep"]["stderr"][-3000:], flush=True)
    if "sweep" not in got:
        print(json.dumps(got, indent=1)[-6000:], flush=True)
    return got


def report(work: Path, out: Path) -> int:
    results = work / "results"
    if not (results / "results.jsonl").is_file():
        print("no results yet: nothing to report")
        return 0
    rep = work / "report"
    shutil.rmtree(rep, ignore_errors=True)
    argv = [sys.executable, "-m", "ct200_tools.cli.bench", "report", str(results), "--out",
            str(rep), "--baseline", "ar"]  # fmt: skip
    rc = subprocess.run(argv, cwd=ROOT, check=False).returncode
    if rc == 0 and shutil.which("pdflatex"):
        for _ in range(2):  # longtable settles its column widths on the second pass
            tex = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "speedup.tex"]
            subprocess.run(tex, cwd=rep, capture_output=True, check=False)
        if shutil.which("pdftoppm") and (rep / "speedup.pdf").is_file():
            png = ["pdftoppm", "-png", "-r", "90", "-f", "1", "-l", "1", "speedup.pdf", "page"]
            subprocess.run(png, cwd=rep, check=False)
    elif rc == 0:
        print("no pdflatex on this machine: speedup.tex is written, compile it elsewhere")
    # One file back (the device tool brings 8 at most): results, report, each set's unit run.
    with tarfile.open(out / "day.tar.gz", "w:gz") as tar:
        tar.add(results, arcname="results")
        if rep.is_dir():
            tar.add(rep, arcname="report")
        for unit in sorted(work.glob("unit-*.json")):
            tar.add(unit, arcname=f"units/{unit.name}")
        tar.add(work / "site.yml", arcname="site.yml")
    return rc


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 benchmarks/day/gpu.py")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ct200-day"),
                        help="kept between calls: the model, the results")  # fmt: skip
    parser.add_argument("--sets", help="comma-separated serving sets (default: all)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="report what --work holds (after a call cut short)")  # fmt: skip
    parser.add_argument("--full", action="store_true", help="the plan as written")
    parser.add_argument("--size", choices=sorted(SIZES), default="session",
                        help="the plan cut to a device session (default) or a test")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    use_carried_wheels()
    import yaml  # noqa: PLC0415 - a dependency of ct200-tools, present once wheels are on the path

    from benchmarks.day import sets  # noqa: PLC0415
    from tests.gpu import llama_cuda, nvsmi  # noqa: PLC0415

    if args.report_only:
        return report(args.work, args.out)
    names = args.sets.split(",") if args.sets else sets.set_names()
    unknown = sorted(set(names) - set(sets.set_names()))
    if unknown:  # before a build of minutes
        raise SystemExit(f"--sets: no serving set {unknown}; the day has {sets.set_names()}")
    t0 = time.monotonic()
    # The children (unit_run, ct200-bench, the doctor) import this checkout's packages too.
    binary = llama_cuda.prepare(args.out)
    src = model_dir(args.work)
    print(f"model: {(src / 'model.gguf').stat().st_size / 1e9:.2f} GB, "
          f"{time.monotonic() - t0:.0f} s so far", flush=True)  # fmt: skip
    if args.build_only:
        return 0
    gpu = nvsmi.query_gpus()[0]["name"].removeprefix("NVIDIA ").strip()
    raw = sets.machine_raw(
        program=binary, source={MODEL: src, f"{MODEL}-draft": src}, gpu=gpu, port=PORT
    )
    site = args.work / "site.yml"
    site.write_text(yaml.safe_dump({"ct200_site": raw}, sort_keys=False))
    failed = 0
    for name in names:
        got = measure(args.work, site, name, None if args.full else SIZES[args.size])
        failed += got.get("sweep", {}).get("rc") != 0
    rc = report(args.work, args.out)
    return 1 if failed or rc or not judged(args.work, names) else 0


def judged(work: Path, names: list[str]) -> bool:
    """benchmarks/day/checks.py on what this call measured: its verdict printed."""
    from benchmarks.day import checks  # noqa: PLC0415

    path = work / "results" / "results.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    points = [p for p in map(json.loads, lines) if p.get("serving_set") in names]
    found = checks.problems(points, want_sets=names)
    for problem in found:
        print(f"day check: {problem}", flush=True)
    print(f"day checks: {len(points)} points of {names}, {len(found)} problems", flush=True)
    return not found


if __name__ == "__main__":
    sys.exit(main())
