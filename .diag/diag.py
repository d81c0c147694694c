"""Issue 22 diagnostic: 8G in 2G shards, variants of the stage, 2 rounds rotated."""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from benchmarks.stage.__main__ import make_data, drop_caches, command
from ct200_tools.stage.builder import build_manifest
out = Path(os.environ["OUT"])
size = int(float(os.environ.get("SIZE_G", "8")) * (1 << 30))
shard = int(float(os.environ.get("SHARD_G", "2")) * (1 << 30))
data = Path("/tmp/diag-data"); dst = Path("/dev/shm/diag")
files = make_data(data, size, shard)
mpath = Path("/tmp/diag-manifest.json")
from ct200_tools.fsutil import write_atomic
write_atomic(str(mpath), build_manifest(str(data), "diag", jobs=32, lfs=False).manifest.to_json())
print("manifest", mpath.exists(), flush=True)
py = [sys.executable, ".diag/once.py"]
V = {
  "cat-parallel": None,
  "read32-dc": ["read", "-", "32", "map", "drop", "auto", "dc"],
  "read32-fadvise": ["read", "-", "32", "map", "drop", "auto", "nodc"],
  "stage32-map-dc": ["stage", "32", "map", "drop", "auto", "dc"],
  "stage32-pwrite-dc": ["stage", "32", "pwrite", "drop", "auto", "dc"],
  "stage32-map-fadvise": ["stage", "32", "map", "drop", "auto", "nodc"],
  "stage16-map-dc": ["stage", "16", "map", "drop", "auto", "dc"],
  "stage16-pwrite-dc": ["stage", "16", "pwrite", "drop", "auto", "dc"],
}
only = os.environ.get("ONLY")
names = [n for n in V if not only or n in only.split(",")]
rows = {n: [] for n in names}
for rnd in range(int(os.environ.get("ROUNDS", "2"))):
    order = names[rnd % len(names):] + names[:rnd % len(names)]
    for n in order:
        shutil.rmtree(dst, ignore_errors=True)
        drop_caches(); time.sleep(5)
        v = V[n]
        if v is None:
            cmds = command("cat-parallel", data, dst, mpath, 32, files)
        elif v[0] == "read":
            cmds = [[*py, "read", str(data), "-", str(mpath), v[2], v[3], v[4], v[5], v[6]]]
        else:
            cmds = [[*py, "stage", str(data), str(dst), str(mpath), v[1], v[2], v[3], v[4], v[5]]]
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
        cpu = 0.0; outs = []
        for p in procs:
            _, st, ru = os.wait4(p.pid, 0); cpu += ru.ru_utime + ru.ru_stime
            outs.append(p.stdout.read())
        wall = time.perf_counter() - t0
        gb = size / 1e9
        inner = json.loads(outs[0]) if v is not None and outs[0].strip() else {}
        row = {"round": rnd, "wall": round(wall, 3), "MBps": round(gb * 1000 / wall), "cpu_s_per_GB": round(cpu / gb, 3), **{k: round(x, 3) for k, x in inner.items()}}
        rows[n].append(row)
        print(n, row, flush=True)
(out / "diag.json").write_text(json.dumps(rows, indent=1))
