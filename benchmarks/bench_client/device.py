"""The witness comparison on the GPU machine, in one self-contained command (it has no network).

Builds llama-server with CUDA from the carried source (tests/gpu/llama_cuda.py; about 4.5 min
on 16 cores), writes the 1.5 GB random-weight model tests/gpu serves, and runs witness.py:
ct200-bench against the minimal client at concurrency 1, 8 and 32, alternating order. After
`bash tests/gpu/carry_llama.sh` here, with the device tool (carry .gpu-carry):

    python3 benchmarks/bench_client/device.py --out $OUT [witness options]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gpu.carried import use_carried_wheels  # noqa: E402

SHAPE = {"layers": 8, "hidden": 2048, "heads": 16, "ffn": 5632}


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    rest = [a for i, a in enumerate(sys.argv[1:], 1) if a != "--out" and sys.argv[i - 1] != "--out"]
    out.mkdir(parents=True, exist_ok=True)
    use_carried_wheels()
    from testbed import tiny_gguf  # noqa: PLC0415 - gguf comes from the carried wheels
    from tests.gpu import llama_cuda  # noqa: PLC0415

    t0 = time.monotonic()
    binary = llama_cuda.prepare(out)
    work = Path(tempfile.mkdtemp(prefix="witness-"))
    model = tiny_gguf.write(work / "rand.gguf", shape=tiny_gguf.Shape(**SHAPE), name="ct200-rand")
    print(f"model: {model.stat().st_size / 1e9:.2f} GB after {time.monotonic() - t0:.0f} s")
    argv = [sys.executable, "-m", "benchmarks.bench_client.witness", "--binary", str(binary)]
    argv += ["--model", str(model), "--out", str(out / "witness"), *rest]
    rc = subprocess.run(argv, cwd=ROOT, check=False).returncode
    with tarfile.open(out / "witness.tar.gz", "w:gz") as tar:
        tar.add(out / "witness", arcname="witness")
    shutil.rmtree(out / "witness")  # the device tool brings back 8 files at most
    sys.exit(rc)


if __name__ == "__main__":
    main()
