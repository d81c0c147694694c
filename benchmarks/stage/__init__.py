"""Staging benchmark: ct200-stage against cp -r, rsync -a and the parallel disk-read limit.

Run from the repository root: `python3 -m benchmarks.stage --out DIR` (or benchmarks/stage/run.sh).
Standard library only, plus ct200_tools.stage from this checkout; xxhash is used when importable.
"""
