"""What a point measured, compactly: the host, the server, the engine and its version, the model
and its size, and a digest of the server's arguments. Points pool as repetitions (aggregate.py)
only when their identities agree; otherwise they are separate configurations.

The identity is built from the run's provenance (the engine's own answers to /v1/models,
/props, /get_server_info, /version, and in a managed run the server's rendered unit files), once
per server, and carried by each point. Old points without one get it from their run's
provenance the same way. Every value comes from an untrusted answer: only short strings and
bounded integers are kept, never anything nested.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Final

from ct200_tools.untrusted import is_plain

#: The fields, in the order a distinguishing suffix names them.
FIELDS: Final = (
    "host",
    "target",
    "engine",
    "version",
    "model",
    "model_path",
    "n_params",
    "model_size",
    "context",
    "args",
)
#: The fields that say which model on which machine: `compare` pairs split configurations by
#: these (engine, version and arguments may be what is being compared).
WHAT: Final = ("host", "model", "model_path", "n_params", "model_size")
#: Names the playbook (or a user) gives the machine when its own hostname is not telling
#: (containers cloned from one template share theirs).
HOST_ENV: Final = "CT200_BENCH_HOST"
MAX_TEXT: Final = 512
MAX_INT: Final = 1 << 62
#: The engines' reported settings that change what is measured (SGLang /get_server_info
#: carries its server arguments; llama-server /props its slots and context).
SETTINGS: Final = (
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "context_length",
    "max_running_requests",
    "chunked_prefill_size",
    "mem_fraction_static",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "attention_backend",
    "enable_torch_compile",
    "disable_radix_cache",
    "total_slots",
)


def this_host() -> str | None:
    """$CT200_BENCH_HOST when set (one printable line), else the machine's hostname."""
    given = os.environ.get(HOST_ENV, "").strip()
    if given and is_plain(given) and len(given) <= 253:
        return given
    return _text(socket.gethostname())


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value and len(value) <= MAX_TEXT else None


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT:
        return value
    return None


def _scalar(value: object) -> str | int | float | bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value if abs(value) <= MAX_INT else None
    return _int(value) if isinstance(value, int) else _text(value)


def _data(info: Mapping[str, object], name: str) -> Mapping[str, object] | None:
    entry = info.get(name)
    if isinstance(entry, dict) and entry.get("status") == 200 and isinstance(entry["data"], dict):
        return entry["data"]
    return None


def _model_entry(info: Mapping[str, object], model: str | None) -> Mapping[str, object]:
    """The /v1/models entry of the model asked for (else the first)."""
    models = _data(info, "models")
    data = models.get("data") if models is not None else None
    entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    chosen = next((m for m in entries if m.get("id") == model), None)
    return chosen or (entries[0] if entries else {})


def digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _files_digest(files: object) -> str | None:
    """A managed server's rendered unit, EnvironmentFile and engine config (their texts)."""
    if not isinstance(files, dict):
        return None
    texts = {
        k: v.get("text")
        for k, v in sorted(files.items())
        if isinstance(v, dict) and isinstance(v.get("text"), str)
    }
    return digest(texts) if texts else None


def _settings(info: Mapping[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for source in (_data(info, "server_info"), _data(info, "props")):
        if source is None:
            continue
        for key in SETTINGS:
            value = _scalar(source.get(key))
            if value is not None:
                out.setdefault(key, value)
    props = _data(info, "props")
    dgs = props.get("default_generation_settings") if props is not None else None
    n_ctx = _int(dgs.get("n_ctx")) if isinstance(dgs, dict) else None
    if n_ctx is not None:
        out.setdefault("n_ctx", n_ctx)
    return out


def of_server(
    info: Mapping[str, object] | None,
    model: object,
    target: object,
    host: object,
    files: object = None,
) -> dict[str, object]:
    """The identity of one server as its answers (`info`, provenance's `engine`) describe it."""
    info = info if isinstance(info, dict) else {}
    engine = info.get("engine")
    name = _text(engine.get("name")) if isinstance(engine, dict) else None
    version = engine.get("version") if isinstance(engine, dict) else None
    entry = _model_entry(info, _text(model))
    raw_meta = entry.get("meta")
    meta: Mapping[str, object] = raw_meta if isinstance(raw_meta, dict) else {}
    sglang, props = _data(info, "server_info"), _data(info, "props")
    path = _text(entry.get("root"))
    for source in (sglang, props):
        if path is None and source is not None:
            path = _text(source.get("model_path"))
    settings = _settings(info)
    context = _int(entry.get("max_model_len")) or _int(settings.get("context_length"))
    context = context or _int(settings.get("n_ctx")) or _int(meta.get("n_ctx_train"))
    args = _files_digest(files) or (digest(settings) if settings else None)
    return {
        "host": _text(host),
        "target": _text(target),
        "engine": name,
        "version": str(version) if _int(version) is not None else _text(version),
        "model": _text(model),
        "model_path": path if path != _text(model) else None,
        "n_params": _int(meta.get("n_params")),
        "model_size": _int(meta.get("size")),
        "context": context,
        "args": args,
    }


def of_provenance(prov: Mapping[str, object] | None, serving_set: object) -> dict[str, object]:
    """The identity of an old point (recorded without one), from its run's provenance: the
    run's engine and model (a --target run) or its set's (a managed run's `sets`)."""
    if not prov:
        return dict.fromkeys(FIELDS)
    sets = prov.get("sets")
    entry = (
        sets.get(serving_set) if isinstance(sets, dict) and isinstance(serving_set, str) else None
    )
    if isinstance(entry, dict):
        engine = entry.get("engine")
        return of_server(
            engine if isinstance(engine, dict) else None,
            entry.get("model"),
            entry.get("target"),
            prov.get("host"),
            entry.get("files"),
        )
    engine = prov.get("engine")
    return of_server(
        engine if isinstance(engine, dict) else None,
        prov.get("model"),
        prov.get("target"),
        prov.get("host"),
    )


def for_run(prov: Mapping[str, object], serving_set: object = None) -> dict[str, object]:
    """A new point's identity: as of_provenance, with the host as this machine names itself
    now ($CT200_BENCH_HOST, else its hostname)."""
    ident = of_provenance(prov, serving_set)
    ident["host"] = this_host()
    return ident


def clean(value: object) -> dict[str, object] | None:
    """A point's recorded identity, type-checked (results files are untrusted); None if none."""
    if not isinstance(value, dict):
        return None
    out: dict[str, object] = {}
    for key in FIELDS:
        v = value.get(key)
        out[key] = _int(v) if key in ("n_params", "model_size", "context") else _text(v)
    return out


def _size(n: int, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n} {unit}"


def _shown(key: str, value: object) -> str:
    """Raw text (cut short): whoever prints it escapes it for its format."""
    if value is None:
        return f"{key.replace('_', ' ')} unknown"
    text = str(value)
    if key in ("host", "target", "engine"):
        return text[:60]
    if key == "model_path":
        return f"model {(os.path.basename(text.rstrip('/')) or text)[:60]}"
    if key in ("n_params", "model_size") and isinstance(value, int):
        return _size(value, "params" if key == "n_params" else "B")
    return f"{key} {text[:60]}"


def differing(identities: Sequence[Mapping[str, object]]) -> list[str]:
    return [k for k in FIELDS if len({json.dumps(i.get(k)) for i in identities}) > 1]


def suffixes(identities: Sequence[Mapping[str, object]]) -> list[str]:
    """Each identity's distinguishing suffix, ' [host-b, model rand-1.5g]', from the fields
    that differ among them; made distinct by a number where the shown values collide."""
    fields = differing(identities)
    out = [" [" + ", ".join(_shown(k, i.get(k)) for k in fields) + "]" for i in identities]
    for n, s in enumerate(out):
        if out.count(s) > 1:
            out[n] = s[:-1] + f", #{n + 1}]"
    return out


def describe(ident: Mapping[str, object]) -> str:
    """Every known field, raw text (the caller escapes it): what a configuration measured."""
    known = [
        (f"{k} " if k in ("host", "target", "engine") else "") + _shown(k, ident.get(k))
        for k in FIELDS
        if ident.get(k) is not None
    ]
    return ", ".join(known) or "unknown (no identity, no provenance)"
