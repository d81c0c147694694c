"""Model staging: restage a model from its persistent copy into /dev/shm, verified, atomically.

Layers, each its own module: `manifest` (what a model is), `engine` (parallel read-hash-write),
`capacity` (will it fit), `lock`, `tree` (marker, journal, names), `stager` (the ordered stage),
`verify`, and `status` with `reader`, `treefacts` and `verdict` (reading only: the doctor's
models probe and checks call these; nothing here imports the doctor),
`builder` and `lfs` (making a manifest), `commands` (what the CLI calls).
Only the standard library is needed; xxhash makes hashing ~10x cheaper when installed.
"""
