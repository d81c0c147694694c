"""A workload of the plan: what each request sends and asks for, validated with field paths.

```yaml
workloads:
  - {name: short, input_tokens: 128, output_tokens: 64, requests: 32}
  - {name: spread, input_tokens: {min: 64, max: 512}, output_tokens: {min: 16, max: 256}}
  - {name: prefix, input_tokens: 512, shared_prefix_tokens: 384, output_tokens: 64}
  - {name: chat, endpoint: chat, prompts: chat.jsonl, output_tokens: from-dataset}
```

A length is a fixed number, `{min, max}` (uniform integers, seeded by the point's prompt seed),
or `from-dataset` (input: the dataset's prompt as it is; output: the reference answer's length).
The dataset itself is read here, once, so a broken file is exit 2 before anything is sent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ct200_tools.bench import datasets
from ct200_tools.spec.read import Issues, Section, kind, section, show

MAX_TOKENS: Final = 1 << 20
MAX_REQUESTS: Final = 1_000_000
FROM_DATASET: Final = "from-dataset"
ENDPOINTS: Final = ("completions", "chat")

WORKLOAD: Final = {
    "name": "short",
    "input_tokens": "128 (or {min: 64, max: 512}, or from-dataset with prompts)",
    "output_tokens": "64 (or {min: 16, max: 256}, or from-dataset with prompts)",
    "prompts": "examples/datasets/ct200-chat.jsonl",
    "requests": "32",
    "endpoint": "chat (or completions, the default)",
    "shared_prefix_tokens": "0",
}
SPAN: Final = {"min": "64", "max": "512"}

Endpoint = Literal["completions", "chat"]


@dataclass(frozen=True)
class Span:
    """Uniform integers from `min` to `max`, both included."""

    min: int
    max: int


#: A length as the plan writes it.
Length = int | Span | Literal["from-dataset"]


@dataclass(frozen=True)
class Workload:
    name: str
    output_tokens: Length
    requests: int
    #: None when the prompts come from a file (as they are).
    input_tokens: int | Span | None = None
    #: A dataset (JSONL of prompt or messages, or ShareGPT JSON), resolved against the plan.
    prompts: str | None = None
    endpoint: Endpoint = "completions"
    #: Tokens every prompt of the run starts with (the same text), to measure a prefix cache.
    shared_prefix_tokens: int = 0

    def as_record(self) -> dict[str, object]:
        """The workload as a point records it (lengths as the plan wrote them)."""
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "input_tokens": _plain(self.input_tokens),
            "output_tokens": _plain(self.output_tokens),
            "prompts": self.prompts,
            "shared_prefix_tokens": self.shared_prefix_tokens,
        }


def _plain(length: Length | None) -> object:
    return {"min": length.min, "max": length.max} if isinstance(length, Span) else length


def _length(s: Section, key: str, *, dataset: bool) -> Length | None:
    value = s.raw(key, nullable=False)
    where = s.where(key)
    if value is None:
        return None
    if value == FROM_DATASET:
        if not dataset:
            s.issues.error(
                where,
                "from-dataset without a dataset",
                f"add prompts: {WORKLOAD['prompts']}, or give a number, e.g. 128",
            )
            return None
        return FROM_DATASET
    if isinstance(value, dict):
        span = section(s.issues, value, where, SPAN, required=("min", "max"))
        if span is None:
            return None
        lo, hi = span.get_int("min", 1, MAX_TOKENS), span.get_int("max", 1, MAX_TOKENS)
        if lo is None or hi is None:
            return None
        if lo > hi:
            s.issues.error(where, f"min {lo} is above max {hi}", "swap them")
            return None
        return Span(lo, hi)
    if isinstance(value, bool) or not isinstance(value, int):
        s.issues.error(
            where,
            f"expected a number of tokens, {{min, max}} or from-dataset, got {kind(value)} "
            f"{show(value)}",
            f"write e.g. {s.examples[key]}",
        )
        return None
    if not 1 <= value <= MAX_TOKENS:
        s.issues.error(
            where, f"{value} is out of range 1..{MAX_TOKENS}", f"use 1 to {MAX_TOKENS}, e.g. 128"
        )
        return None
    return value


def _low(length: Length | None) -> int:
    return length.min if isinstance(length, Span) else length if isinstance(length, int) else 0


def parse(issues: Issues, value: object, path: str, base: Path) -> Workload | None:
    before = len(issues.items)
    s = section(issues, value, path, WORKLOAD, required=("name", "output_tokens"))
    if s is None:
        return None
    name = s.get_name("name")
    prompts = s.get_str("prompts")
    dataset = "prompts" in s.data
    out_tokens = _length(s, "output_tokens", dataset=dataset)
    in_tokens = _length(s, "input_tokens", dataset=dataset)
    requests = s.get_int("requests", 1, MAX_REQUESTS)
    endpoint = s.get_choice("endpoint", ENDPOINTS) or "completions"
    prefix = s.get_int("shared_prefix_tokens", 0, MAX_TOKENS) or 0
    if dataset and isinstance(in_tokens, int | Span):
        issues.error(
            path,
            "gives both input_tokens and prompts",
            "keep one: input_tokens for made-up prompts of that length, or prompts: FILE (its "
            "prompts are sent as they are; input_tokens: from-dataset says so)",
        )
    elif "input_tokens" not in s.data and not dataset:
        issues.error(
            path,
            "gives neither input_tokens nor prompts",
            "add input_tokens: 128 (made-up prompts) or prompts: prompts.jsonl",
        )
    if prefix and dataset:
        issues.error(
            s.where("shared_prefix_tokens"),
            "applies to made-up prompts, not to a dataset's",
            "drop shared_prefix_tokens, or use input_tokens instead of prompts",
        )
    elif prefix and isinstance(in_tokens, int | Span) and prefix >= _low(in_tokens):
        issues.error(
            s.where("shared_prefix_tokens"),
            f"{prefix} leaves no fresh token in a prompt of {_low(in_tokens)} tokens",
            "make it smaller than input_tokens (its min), so each prompt has fresh tokens after it",
        )
    if prompts is not None and not os.path.isabs(prompts):
        prompts = str(base / prompts)
    if prompts is not None and len(issues.items) == before:
        _check_dataset(issues, s, prompts, endpoint, out_tokens)
    if name is None or out_tokens is None:
        return None
    if requests is None and not s.has("requests"):
        requests = 32
    if requests is None:
        return None
    return Workload(
        name,
        out_tokens,
        requests,
        None if in_tokens == FROM_DATASET else in_tokens,
        prompts,
        endpoint,  # type: ignore[arg-type]
        prefix,
    )


def _check_dataset(
    issues: Issues, s: Section, path: str, endpoint: str, out_tokens: Length | None
) -> None:
    """Read the dataset now (bounded), so its problems are exit 2 before any request."""
    where = s.where("prompts")
    try:
        data = datasets.load(path)
    except datasets.DatasetError as exc:
        issues.error(where, exc.message, exc.fix)
        return
    if endpoint == "completions" and data.chat_only is not None:
        issues.error(
            where,
            f"{data.chat_only} is a list of chat messages, which /v1/completions cannot send",
            "add endpoint: chat to the workload (POST /v1/chat/completions)",
        )
    if out_tokens == FROM_DATASET and data.without_reference is not None:
        issues.error(
            s.where("output_tokens"),
            f"from-dataset, but {data.without_reference} has no reference answer",
            'give each entry a reference answer (JSONL: "reference" or "output_tokens"; '
            "ShareGPT: a gpt turn after the prompt), or set output_tokens: 128",
        )
