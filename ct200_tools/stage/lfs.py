"""Hugging Face's own sha256 for each LFS file, where the download left it behind.

Three places carry it, all read-only:
- `huggingface-cli download --local-dir`: `.cache/huggingface/download/<file>.metadata`, whose
  second line is the ETag, which for LFS files is the sha256 (64 hex digits; git blobs have 40);
- the hub cache (`snapshots/<rev>/<file>` symlinks to `blobs/<sha256>`): the blob's name;
- the Hub API's model info (`/api/models/<id>?blobs=true`) saved to a file: siblings[].lfs.sha256.
"""

from __future__ import annotations

import os
import re

from ct200_tools.stage.errors import SourceError
from ct200_tools.untrusted import (
    FieldError,
    Fields,
    UntrustedInputError,
    each,
    load_json,
    read_bounded,
    show,
)

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
        lines = read_bounded(meta, "download metadata", 64 << 10, "").decode().splitlines()
    except (UntrustedInputError, UnicodeDecodeError):
        return None  # not what the Hub's client writes: it vouches for nothing
    etag = lines[1].strip().strip('"').lower() if len(lines) > 1 else ""
    return etag if _SHA256.match(etag) else None


def _from_blob_link(root: str, rel: str) -> str | None:
    path = os.path.join(root, rel)
    if not os.path.islink(path):
        return None
    name = os.path.basename(os.readlink(path)).lower()
    return name if _SHA256.match(name) else None


def _from_model_info(path: str) -> dict[str, str]:
    """siblings[].rfilename -> siblings[].lfs.sha256 of the Hub's model info saved at ``path``;
    SourceError naming the file (or the field) when it is not that."""
    fix = (
        "save the Hub's model info as a file: curl -o info.json "
        "https://huggingface.co/api/models/<id>?blobs=true, and pass --model-info info.json"
    )
    try:
        info = Fields(load_json(path, "model info", 64 << 20, fix), "")
        out: dict[str, str] = {}
        for where, item in each(info.raw("siblings") or [], "siblings"):
            sibling = Fields(item, where)
            lfs = sibling.opt_obj("lfs")
            sha = ((lfs.opt_text("sha256") if lfs else None) or "").lower()
            name = sibling.opt_text("rfilename")
            if name and _SHA256.match(sha):
                out[name] = sha
    except UntrustedInputError as exc:
        raise SourceError(exc.message, exc.fix) from None
    except FieldError as exc:
        raise SourceError(f"model info {show(path)}: {exc}", fix) from None
    return out
