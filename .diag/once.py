"""Diagnostic driver (issue 22, not for the repo): one stage/read with knobs, timings as JSON."""
import time
T0 = time.perf_counter()
import json, sys, os
from ct200_tools.stage import engine as E, stager as S
from ct200_tools.stage.manifest import load_manifest
T1 = time.perf_counter()
mode, src, dst, manifest, jobs, wmode, drop, runlen, dc = sys.argv[1:10]

class Eng(E.ChunkEngine):
    def __init__(self, **kw):
        super().__init__(**kw)
        if dc != "dc":
            self._dontcache = False
    def _tasks(self, states):
        plan = super()._tasks(states)
        if runlen == "auto":
            return plan
        self._run_len = int(runlen)
        from collections import deque
        plan = deque()
        for i, st in enumerate(states):
            t = self._file_tasks(i, st)
            st.remaining = len(t)
            plan.extend(t)
        return plan
S.ChunkEngine = Eng
if mode == "stage":
    opts = S.StageOptions(jobs=int(jobs), drop_cache=drop == "drop", write_mode=wmode)
    r = S.stage(src, dst, manifest_path=manifest, options=opts)
    inner = r.seconds
else:
    m = load_manifest(manifest)
    e = Eng(algorithm=m.algorithm, chunk_size=m.chunk_size, jobs=int(jobs), drop_cache=drop == "drop")
    t = time.perf_counter()
    e.run(src, [E.FileJob(f.path, f.size, f.chunks) for f in m.files])
    inner = time.perf_counter() - t
T2 = time.perf_counter()
print(json.dumps({"imports": T1 - T0, "inner": inner, "total": T2 - T0}))
