#!/usr/bin/env bash
# The staging benchmark on the lent GPU machine (issue 22), in one run under 9 minutes:
#   8G in 2G shards, then 16G in 1G shards, 3 rounds each, contenders
#   ct200-stage,cp,cat-parallel,cat-sequential,ct200-verify; source on the local disk (/tmp),
#   target the tmpfs /dev/shm, caches dropped before every copy (needs root).
# Writes under $OUT (6 files): env.txt, run.log, 8G/results.{json,txt}, 16G/results.{json,txt}.
# Exit 0 when both runs completed; else the failing run's exit (124: cut at its time limit).
# Only the system python3 and this checkout (PYTHONPATH=$PWD): no venv, nothing installed.
#
#   OUT=/tmp/out bash benchmarks/stage/device.sh          # from the repository root, as root
#
# xxhash: the stage hashes with XXH3 when python3 can import xxhash, else with BLAKE2b, whose
# ~1 CPU-s/GB per core would then be measured instead of the copy. Where python3 lacks it, run
# benchmarks/stage/carry_xxhash.sh here first and pass carry [".gpu-carry"] to the device tool:
# the wheel matching python3 is unpacked into a temporary directory on PYTHONPATH.
# FULL, FULL2 and ROUNDS replace the contenders of the first and second size and the rounds (a
# diagnostic run of engine variants, e.g. FULL=ct200-stage,ct200-s1w,cat-parallel ROUNDS=2).
# Time: the 8G run is bounded to LIMIT_FIRST_S (default 230 s); the 16G run gets what is left of
# BUDGET_S (default 525 s). When the 8G run says the whole 16G set cannot fit, the 16G run drops
# cat-sequential, then cp (ct200-stage and cat-parallel are what the issue's goal compares), and
# says so in run.log and on stdout. Results are written after every round, so a run cut short
# still leaves its complete rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the directory for the results}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-525}
LIMIT_FIRST_S=${LIMIT_FIRST_S:-230}
#: SIZE:SHARD of the two runs (the second gets what is left of BUDGET_S); one SIZE:SHARD: one run.
SIZES=${SIZES:-8G:2G 16G:1G}
WHEELS=${WHEELS:-.gpu-carry/wheels}
DATA=${DATA:-/tmp/ct200-bench-data}
DST=${DST:-/dev/shm/ct200-bench}
FULL=${FULL:-ct200-stage,cp,cat-parallel,cat-sequential,ct200-verify}
#: Contenders of the second size, taken as they are (no dropping for time): e.g. the same engine
#: variants at both sizes. Unset: FULL, less what the time left allows (below).
FULL2=${FULL2:-}
ROUNDS=${ROUNDS:-3}
#: More contenders for the first size only, e.g. EXTRA=ct200-nolock: the stage without its
#: per-file write lock, to see on the machine itself what the lock bought (about +35 s at 8G;
#: the 16G run may then drop cat-sequential for time).
EXTRA=${EXTRA:-}
export PYTHONPATH=$PWD
start=$(date +%s)

loud() { printf '\n########## %s ##########\n\n' "$*"; }

hash_setup() {  # sets PYTHONPATH (a carried wheel) and HASH
  if ! "$PY" -c 'import xxhash' 2>/dev/null; then
    local tag whl
    tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    whl=$(ls "$WHEELS"/xxhash-*-"$tag"-*.whl 2>/dev/null | head -n 1)
    if [ -n "$whl" ]; then
      "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$whl" "$tmp/site"
      export PYTHONPATH=$tmp/site:$PYTHONPATH
      echo "xxhash: not installed for $PY; using the carried $whl (unpacked, not installed)"
    fi
  fi
  HASH=$("$PY" -c 'from ct200_tools.stage.hashing import default_algorithm as a; print(a())')
  if [ "$HASH" != xxh3-128 ]; then
    loud "NO XXHASH for $PY ($("$PY" -V 2>&1)): the stage hashes with $HASH, ~1 CPU-s/GB per" \
      "core; these figures are NOT comparable to issue 22's (XXH3). Fix: run" \
      "benchmarks/stage/carry_xxhash.sh on a machine with network, carry .gpu-carry"
  fi
}

environment() {
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)," \
    "$(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo "python: $("$PY" -V 2>&1), hash $HASH"
  echo "cpus: $(nproc); kernel: $(uname -r)"
  free -g | sed -n 1,2p
  df -hT "$(dirname "$DATA")" "$(dirname "$DST")"
  grep -m1 'model name' /proc/cpuinfo
  echo "load: $(cat /proc/loadavg)"
}

bench() {  # SIZE SHARD ONLY LIMIT_S
  local size=$1 shard=$2 only=$3 limit=$4 rc
  loud "$size: --size $size --shard-size $shard --rounds $ROUNDS --only $only (limit ${limit}s)"
  mkdir -p "$OUT/$size"
  timeout --kill-after=15 "$limit" "$PY" -m benchmarks.stage --out "$OUT/$size" \
    --size "$size" --shard-size "$shard" --rounds "$ROUNDS" --only "$only" \
    --data "$DATA-$size" --dst "$DST" --remove-data ${SETTLE:+--settle "$SETTLE"}
  rc=$?
  rm -rf "$DST" "$DATA-$size" "$OUT/$size/manifest.json"
  if [ "$rc" -ne 0 ]; then
    loud "$size: exit $rc$([ "$rc" -eq 124 ] && echo ' (cut at its time limit: complete rounds only)')"
  fi
  return "$rc"
}

main() {
  local first second rc t1 left only
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp" "$DST"' EXIT
  hash_setup
  environment > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  read -r first second <<<"$SIZES"
  bench "${first%%:*}" "${first#*:}" "$FULL${EXTRA:+,$EXTRA}" "$LIMIT_FIRST_S"
  rc=$?
  t1=$(($(date +%s) - start))
  left=$((BUDGET_S - t1 - 10))
  if [ -z "$second" ]; then  # SIZES named one size
    loud "done in ${t1}s, exit $rc; results under $OUT"
    return "$rc"
  fi
  # The second size (twice the bytes) costs about 1.7x the first: settling and dropping the
  # caches are per run, not per byte.
  if [ "$left" -lt 60 ]; then
    loud "${second%%:*}: skipped, ${left}s left after ${first%%:*} (${t1}s)"
    return 1
  elif [ -n "$FULL2" ]; then
    only=$FULL2
  elif [ $((t1 * 17 / 10)) -le "$left" ]; then
    only=$FULL
  elif [ $((t1 * 14 / 10)) -le "$left" ]; then
    only=ct200-stage,cp,cat-parallel,ct200-verify
    loud "${second%%:*}: no time for every contender (${first%%:*} took ${t1}s, ${left}s" \
      "left): cat-sequential left out"
  else
    only=ct200-stage,cat-parallel,ct200-verify
    loud "${second%%:*}: no time for every contender (${first%%:*} took ${t1}s, ${left}s" \
      "left): only ct200-stage, cat-parallel and ct200-verify"
  fi
  bench "${second%%:*}" "${second#*:}" "$only" "$left" || rc=$?
  loud "done in $(($(date +%s) - start))s, exit $rc; results under $OUT"
  return "$rc"
}

# Everything on stdout and in run.log; the exit status is main's.
main 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
