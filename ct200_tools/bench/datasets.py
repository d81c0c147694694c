"""Prompts from files people already have: JSONL of prompt or messages, and ShareGPT JSON.

JSONL: one object a line (blank lines skipped), with `prompt` (a string) or `messages` (a list
of {role: system|user|assistant, content: a string or OpenAI's list of text parts}), and
optionally a reference answer for `output_tokens: from-dataset`: `output_tokens` (a number) or
`reference` (its text). Other keys (ids, tags) are ignored.

ShareGPT (the file is a JSON list): `[{conversations: [{from: human|gpt|system, value}]}]`. The
first human turn is the prompt (a system turn before it becomes the system message of a chat
request; /v1/completions gets the human turn alone), the first gpt turn after it the reference
answer. An entry without a human turn is skipped and counted, as vLLM's reader does.

The file is hostile: read bounded (MAX_BYTES, a regular file), nested at most MAX_DEPTH levels,
MAX_ENTRIES entries, each text at most MAX_TEXT characters; every problem names the line (JSONL)
or the entry (ShareGPT, counted from 0) and the fix. A file is parsed once per run (cached by
its path, size and modification time), however many points use it.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Final, Literal

from ct200_tools.untrusted import UntrustedInputError, json_depth, read_bounded, show

MAX_BYTES: Final = 64 << 20
MAX_ENTRIES: Final = 100_000
MAX_DEPTH: Final = 16
MAX_TEXT: Final = 1 << 20
MAX_MESSAGES: Final = 256
ROLES: Final = ("system", "user", "assistant")
#: ShareGPT speakers: who is the user, who answers (variants seen in public dumps).
HUMAN: Final = ("human", "user")
GPT: Final = ("gpt", "assistant", "chatgpt")
JSONL_FIX: Final = (
    'write one JSON object a line, {"prompt": "..."} or {"messages": [{"role": "user", '
    '"content": "..."}]}, UTF-8 (docs/bench.md, Datasets)'
)
SHAREGPT_FIX: Final = (
    'write a JSON list of {"conversations": [{"from": "human", "value": "..."}, '
    '{"from": "gpt", "value": "..."}]} (docs/bench.md, Datasets)'
)

Layout = Literal["jsonl", "sharegpt"]
Message = tuple[str, str]


class DatasetError(Exception):
    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Entry:
    #: What /v1/completions sends (a JSONL prompt, or ShareGPT's first human turn).
    prompt: str
    #: What /v1/chat/completions sends; None: the prompt as a single user message.
    messages: tuple[Message, ...] | None = None
    reference: str | None = None
    output_tokens: int | None = None
    #: True for a JSONL `messages` entry: there is no plain prompt to send to /v1/completions.
    chat_only: bool = False

    def chat(self) -> list[dict[str, str]]:
        turns = self.messages if self.messages is not None else (("user", self.prompt),)
        return [{"role": role, "content": content} for role, content in turns]


@dataclass(frozen=True)
class Dataset:
    layout: Layout
    entries: tuple[Entry, ...]
    #: ShareGPT entries without a human turn, not used.
    skipped: int = 0
    #: Where the first `messages` entry is ("line 3"), for the error of an endpoint: completions.
    chat_only: str | None = None
    #: Where the first entry without a reference answer is, for output_tokens: from-dataset.
    without_reference: str | None = None

    def describe(self) -> dict[str, object]:
        return {"layout": self.layout, "entries": len(self.entries), "skipped": self.skipped}


def load(path: str) -> Dataset:
    """The dataset at `path`; DatasetError names the problem and its fix."""
    try:
        st = os.stat(path)
    except OSError:
        return _read(path)  # read_bounded says why, in its words
    return _cached(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _cached(path: str, _size: int, _mtime_ns: int) -> Dataset:
    return _read(path)


def _read(path: str) -> Dataset:
    try:
        data = read_bounded(path, "the prompts file", MAX_BYTES, JSONL_FIX)
    except UntrustedInputError as exc:
        raise DatasetError(exc.message, exc.fix) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"is not UTF-8 (byte {exc.start})", JSONL_FIX) from None
    if text.lstrip().startswith("["):
        return _sharegpt(text)
    return _jsonl(text)


def _text(value: object, where: str, what: str, fix: str) -> str:
    if not isinstance(value, str):
        raise DatasetError(f"{where}: {what} is not a string ({show(value, 60)})", fix)
    if len(value) > MAX_TEXT:
        raise DatasetError(f"{where}: {what} is longer than {MAX_TEXT} characters", "cut it")
    return value


def _count(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
        raise DatasetError(
            f"{where}: output_tokens is not a number of tokens ({show(value, 60)})",
            'write a whole number from 1, e.g. "output_tokens": 128, or drop it',
        )
    return value


def _parts(content: object) -> object:
    """OpenAI's content parts ([{type: text, text}, ...]) as one text; anything else as it is
    (an image part is no text: the content is then refused as not a string)."""
    if not isinstance(content, list) or not content:
        return content
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
        return content
    return "".join(str(t) for t in texts)


def _messages(value: object, where: str) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_MESSAGES:
        raise DatasetError(
            f"{where}: messages is not a list of 1 to {MAX_MESSAGES} messages", JSONL_FIX
        )
    out = []
    for j, m in enumerate(value):
        at = f"{where}: messages[{j}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise DatasetError(
                f"{at} has no role of {', '.join(ROLES)} ({show(m, 80)})",
                'write {"role": "user", "content": "..."}',
            )
        out.append((str(role), _text(_parts(m.get("content")), at, "content", JSONL_FIX)))
    if out[-1][0] == "assistant":
        raise DatasetError(
            f"{where}: the last message is the assistant's: there is nothing to answer",
            'end with a user message; put a reference answer in "reference"',
        )
    return tuple(out)


def _jsonl(text: str) -> Dataset:
    entries: list[Entry] = []
    chat_only = without_reference = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        if json_depth(line) > MAX_DEPTH:
            raise DatasetError(f"{where} is nested deeper than {MAX_DEPTH} levels", JSONL_FIX)
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
            raise DatasetError(
                f"{where} is not a JSON object with either a prompt or messages", JSONL_FIX
            )
        reference = obj.get("reference")
        if reference is not None:
            reference = _text(reference, where, "reference", JSONL_FIX)
        count = _count(obj.get("output_tokens"), where)
        if "messages" in obj:
            messages = _messages(obj["messages"], where)
            prompt = next((c for r, c in reversed(messages) if r == "user"), messages[-1][1])
            entry = Entry(prompt, messages, reference, count, chat_only=True)
            chat_only = chat_only or where
        else:
            entry = Entry(_text(obj["prompt"], where, "prompt", JSONL_FIX), None, reference, count)
        if reference is None and count is None:
            without_reference = without_reference or where
        entries.append(entry)
        if len(entries) > MAX_ENTRIES:
            raise DatasetError(f"has more than {MAX_ENTRIES} prompts", "use fewer")
    if not entries:
        raise DatasetError("has no prompt", JSONL_FIX)
    return Dataset("jsonl", tuple(entries), 0, chat_only, without_reference)


def _sharegpt(text: str) -> Dataset:
    if json_depth(text) > MAX_DEPTH:
        raise DatasetError(f"is nested deeper than {MAX_DEPTH} levels", SHAREGPT_FIX)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DatasetError(
            f"starts with [ but is not JSON ({show(exc, 120)})", SHAREGPT_FIX
        ) from None
    if not isinstance(doc, list) or len(doc) > MAX_ENTRIES:
        raise DatasetError(f"is not a JSON list of at most {MAX_ENTRIES} entries", SHAREGPT_FIX)
    entries: list[Entry] = []
    skipped = 0
    without_reference = None
    for i, item in enumerate(doc):
        where = f"entry {i}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise DatasetError(
                f"{where} has no conversations list ({show(item, 80)})", SHAREGPT_FIX
            )
        entry = _conversation(turns, where)
        if entry is None:
            skipped += 1
            continue
        if entry.reference is None:
            without_reference = without_reference or where
        entries.append(entry)
    if not entries:
        raise DatasetError("has no conversation with a human turn", SHAREGPT_FIX)
    return Dataset("sharegpt", tuple(entries), skipped, None, without_reference)


def _conversation(turns: list[object], where: str) -> Entry | None:
    said: list[tuple[str, str]] = []
    for j, turn in enumerate(turns):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if not isinstance(speaker, str) or not isinstance(turn, dict):
            raise DatasetError(
                f"{where}: conversations[{j}] is not {{from, value}} ({show(turn, 80)})",
                SHAREGPT_FIX,
            )
        said.append(
            (
                speaker,
                _text(turn.get("value"), f"{where}: conversations[{j}]", "value", SHAREGPT_FIX),
            )
        )
    first = next((j for j, (who, value) in enumerate(said) if who in HUMAN and value), None)
    if first is None:
        return None
    prompt = said[first][1]
    system = said[first - 1][1] if first and said[first - 1][0] == "system" else None
    reference = next((v for who, v in said[first + 1 :] if who in GPT), None)
    messages = ((("system", system),) if system else ()) + (("user", prompt),)
    return Entry(prompt, messages, reference)
