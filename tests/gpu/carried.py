"""What the GPU machine lacks and tests/gpu brings in .gpu-carry/ (it has no network).

carry_llama.sh packs the llama.cpp source and a few wheels there; the device tool carries the
folder (`carry: [".gpu-carry"]`). Wheels are unzipped into a directory put on sys.path and
PYTHONPATH (so the children the tests start see them too), only for modules the machine's own
Python cannot import: nothing is installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path

CARRY = Path(__file__).resolve().parents[2] / ".gpu-carry"
WHEELS = CARRY / "wheels"
UNPACKED = Path("/tmp/ct200-gpu-wheels")
LLAMA_SOURCE = CARRY / "llama-src.tar.xz"
#: The modules tests/gpu and ct200_tools import that an image with torch may lack, and the
#: distribution (wheel name) that brings each: aiohttp (ct200-bench's client) and what it imports,
#: and pynvml (ct200-bench's telemetry: tests/gpu/test_telemetry.py).
NEEDED = {
    "gguf": "gguf",
    "xxhash": "xxhash",
    "psutil": "psutil",
    "aiohttp": "aiohttp",
    "aiohappyeyeballs": "aiohappyeyeballs",
    "aiosignal": "aiosignal",
    "attr": "attrs",
    "frozenlist": "frozenlist",
    "multidict": "multidict",
    "propcache": "propcache",
    "yarl": "yarl",
    "idna": "idna",
    "typing_extensions": "typing_extensions",
    "pynvml": "nvidia_ml_py",
}


def _tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def use_carried_wheels() -> list[str]:
    """Unzip the carried wheel of each NEEDED module this Python lacks; returns their names."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing or not WHEELS.is_dir():
        return []
    used = []
    for module in missing:
        candidates = sorted(WHEELS.glob(f"{NEEDED[module]}-*.whl"))
        fitting = [w for w in candidates if "-py3-" in w.name or "abi3" in w.name]
        fitting += [w for w in candidates if f"-{_tag()}-" in w.name]
        if not fitting:
            continue
        with zipfile.ZipFile(fitting[0]) as whl:
            whl.extractall(UNPACKED)
        used.append(module)
    if used:
        sys.path.insert(0, str(UNPACKED))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(UNPACKED), os.environ.get("PYTHONPATH", "")) if p
        )
        importlib.invalidate_caches()
    return used
