#!/usr/bin/env bash
# One-line entry for the staging benchmark; options as for `python3 -m benchmarks.stage --help`.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m benchmarks.stage "$@"
