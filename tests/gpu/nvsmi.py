"""Parsers for nvidia-smi output: the ground truth the doctor is compared against."""

from __future__ import annotations

import re
import shutil
import subprocess

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")


def run(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def parse_matrix(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` or `topo -p2p r|w` -> {(a, b): letter} for a < b."""
    rows: dict[int, list[str]] = {}
    header: list[int] = []
    for raw in _ANSI.sub("", text).splitlines():
        tokens = raw.split()
        if not tokens:
            continue
        if not header and all(_GPU.match(t) for t in tokens[:1]) and raw[:1].isspace():
            header = [int(m.group(1)) for t in tokens if (m := _GPU.match(t))]
            continue
        m = _GPU.match(tokens[0])
        if header and m:
            rows[int(m.group(1))] = tokens[1 : 1 + len(header)]
        if raw.startswith("Legend"):
            break
    out = {}
    for a, cells in rows.items():
        for col, cell in zip(header, cells, strict=False):
            if a < col:
                out[(a, col)] = cell
    return out


def parse_numa_affinity(text: str) -> dict[int, str]:
    """`nvidia-smi topo -m`: GPU index -> its 'NUMA Affinity' cell ('0', 'N/A', ...)."""
    lines = _ANSI.sub("", text).splitlines()
    head = next((ln for ln in lines if "NUMA Affinity" in ln), None)
    if head is None:
        return {}
    cols = re.split(r"\t+", head.strip())
    idx = cols.index("NUMA Affinity")
    out = {}
    for ln in lines:
        cells = re.split(r"\t+", ln.strip())
        m = _GPU.match(cells[0]) if cells else None
        if m and len(cells) > idx + 1:
            out[int(m.group(1))] = cells[idx + 1].strip()
    return out


def query(what: str, fields: list[str]) -> list[dict[str, str]]:
    """`nvidia-smi --query-WHAT=FIELDS` (what: gpu, compute-apps) -> one dict per row."""
    text = run(f"--query-{what}={','.join(fields)}", "--format=csv,noheader,nounits")
    return [
        dict(zip(fields, (c.strip() for c in ln.split(",")), strict=True))
        for ln in text.strip().splitlines()
    ]


def query_gpus() -> list[dict[str, str]]:
    fields = [
        "index",
        "name",
        "pci.bus_id",
        "uuid",
        "memory.total",
        "pcie.link.gen.max",
        "pcie.link.width.max",
        "persistence_mode",
    ]
    return query("gpu", fields)
