#!/usr/bin/env bash
# Put xxhash wheels for the usual CPython versions into .gpu-carry/wheels/ (gitignored), for
# benchmarks/stage/device.sh on a machine without network whose python3 lacks xxhash: pass
# `carry: [".gpu-carry"]` to the device tool. device.sh unpacks the matching wheel into a temporary
# directory on PYTHONPATH (nothing is installed). Without it the stage hashes with BLAKE2b, whose
# CPU cost (~1 s/GB per core) would be measured instead of the copy's.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-carry/wheels
mkdir -p "$out"
for v in 3.10 3.11 3.12 3.13; do
  "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$v" --dest "$out" "xxhash>=3.4"
done
ls -l "$out"
