"""One ct200-stage run in its own process, as the benchmark times it.

python3 -m benchmarks.stage._stage_once stage SRC DST MANIFEST JOBS [--direct] [--no-drop]
    [--buffer BYTES] [--no-write-lock] [--thread-times FILE]
python3 -m benchmarks.stage._stage_once read SRC MANIFEST JOBS     read + hash + check, no writes
python3 -m benchmarks.stage._stage_once verify DST JOBS            ct200-stage verify DST
"""

from __future__ import annotations

import argparse
import json

from benchmarks.stage import _threadtime
from ct200_tools.stage.engine import ChunkEngine, FileJob
from ct200_tools.stage.manifest import load_manifest
from ct200_tools.stage.stager import StageOptions, stage
from ct200_tools.stage.verify import embedded_manifest, verify_tree


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("stage", "read", "verify"))
    p.add_argument("paths", nargs="+")
    p.add_argument("--direct", action="store_true")
    p.add_argument("--no-drop", action="store_true")
    p.add_argument("--no-write-lock", action="store_true")
    p.add_argument("--buffer", type=int, default=None)
    p.add_argument("--thread-times", help="write where the threads' wall time went (JSON)")
    a = p.parse_args()
    if a.thread_times:
        _threadtime.install(a.thread_times)
    if a.what == "stage":
        src, dst, manifest, jobs = a.paths
        opts = StageOptions(
            jobs=int(jobs),
            read_mode="direct" if a.direct else "buffered",
            buffer_size=a.buffer,
            drop_cache=not a.no_drop,
            one_writer_per_file=not a.no_write_lock,
        )
        result = stage(src, dst, manifest_path=manifest, options=opts)
        print(json.dumps({"read_mode": result.read_mode, "seconds": result.seconds}))
    elif a.what == "read":
        src, manifest, jobs = a.paths
        m = load_manifest(manifest)
        engine = ChunkEngine(
            algorithm=m.algorithm, chunk_size=m.chunk_size, jobs=int(jobs), buffer_size=a.buffer
        )
        engine.run(src, [FileJob(f.path, f.size, f.chunks) for f in m.files])
    else:
        dst, jobs = a.paths
        m = embedded_manifest(dst)
        assert m is not None
        verify_tree(dst, m, jobs=int(jobs))


if __name__ == "__main__":
    main()
