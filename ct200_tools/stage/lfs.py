"""Hugging Face's own sha256 for each LFS file, where the download left it behind.

Three places carry it, all read-only:
- `huggingface-cli download --local-dir`: `.cache/huggingface/download/<file>.metadata`, whose
  second line is the ETag, which for LFS files is the sha256 (64 hex digits; git blobs have 40);
- the hub cache (`snapshots/<rev>/<file>` symlinks to `blobs/<sha256>`): the blob's name;
- the Hub API's model info (`/api/models/<id>?blobs=true`) saved to a file: siblings[].lfs.sha256.
"""

from __future__ import annotations

import json
import os
import re

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def lfs_hashes(root: str, paths: list[str], model_info: str | None = None) -> dict[str, str]:
    """sha256 per relative path, for the paths any source above vouches for."""
    found: dict[str, str] = {}
    if model_info is not None:
        found.update(_from_model_info(model_info))
    for rel in paths:
        if rel in found:
            continue
        sha = _from_local_dir(root, rel) or _from_blob_link(root, rel)
        if sha:
            found[rel] = sha
    return {p: found[p] for p in paths if p in found}


def _from_local_dir(root: str, rel: str) -> str | None:
    meta = os.path.join(root, ".cache", "huggingface", "download", rel + ".metadata")
    try:
        with open(meta, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    etag = lines[1].strip().strip('"').lower() if len(lines) > 1 else ""
    return etag if _SHA256.match(etag) else None


def _from_blob_link(root: str, rel: str) -> str | None:
    path = os.path.join(root, rel)
    if not os.path.islink(path):
        return None
    name = os.path.basename(os.readlink(path)).lower()
    return name if _SHA256.match(name) else None


def _from_model_info(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as fh:
        info = json.load(fh)
    out: dict[str, str] = {}
    for sibling in info.get("siblings", []):
        lfs = sibling.get("lfs") or {}
        sha = str(lfs.get("sha256", "")).lower()
        if sibling.get("rfilename") and _SHA256.match(sha):
            out[str(sibling["rfilename"])] = sha
    return out
