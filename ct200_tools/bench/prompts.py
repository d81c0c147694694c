"""Fresh prompts of a given input length, made deterministically from a seed.

A prompt is a sequence of common English words drawn with `random.Random(seed, index)`. The
seed is the point's own (`prompt_seed`: the plan's seed, the run id and the point's key, hashed),
so no prompt of a run shares more than a chance word or two with any prompt sent before it, in
this run or an earlier one: a server's prompt cache (llama-server's slots, vLLM's and SGLang's
prefix caches) has nothing to serve, and TTFT measures the prompt's evaluation. A workload that
asks for `shared_prefix_tokens` gets one prefix text for the whole run before each fresh rest.
The length is made right with the server's own tokenizer where it has one (POST /tokenize: vLLM,
SGLang, llama-server): the word count is corrected until the server counts the wanted number of
tokens, then, where a word is several tokens, characters are cut from the end; else the closest
found. The words-per-token ratio learnt is kept by the Maker for every later prompt and point,
so a prompt usually costs one /tokenize. Without /tokenize (asked once) the prompt has one word
per wanted token (about one token each in Llama-family tokenizers) and the method says
"approximate"; the real count is always the server's `usage.prompt_tokens`, recorded per point.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Final, Literal

import aiohttp

from ct200_tools.bench.http import NoAnswer, request_json
from ct200_tools.untrusted import show

# Short, common words: each is one token, with its leading space, in the usual BPE vocabularies.
_WORD_TEXT: Final = (
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big "
    "high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye "
    "never last let thought city tree cross farm hard start might story saw far sea draw left late "
    "run while press close night real life few north open seem together next white children begin "
    "got walk example ease paper group always music those both mark often letter until mile river "
    "car feet care second book carry took science eat room friend began idea fish mountain stop "
    "once base hear horse cut sure watch color face wood main enough plain girl usual young ready "
    "above ever red list though feel talk bird soon body dog family direct pose leave song measure "
    "door product black short numeral class wind question happen complete ship area half rock "
    "order fire south problem piece told knew pass since top whole king space heard best hour "
    "better true during hundred five remember step early hold west ground interest reach fast"
)
WORDS: Final = tuple(_WORD_TEXT.split())
#: Corrections of the word count before the closest count found is taken.
MAX_ROUNDS: Final = 6
#: Characters cut from the end, one a try, to come closer than a whole word.
MAX_TRIM: Final = 24

Method = Literal["tokenize", "approximate"]


@dataclass(frozen=True)
class Prompt:
    text: str
    #: The server's count when it was asked (/tokenize), else the word count.
    tokens: int
    method: Method


def prompt_seed(plan_seed: int, run_id: str, key: str) -> int:
    """A point's prompt seed: a different one for every run and point, reproducible from both."""
    digest = hashlib.sha256(f"{plan_seed}:{run_id}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def draw(lo: int, hi: int, count: int, seed: int, salt: str) -> list[int]:
    """`count` uniform integers from lo to hi (both included), seeded: a length distribution."""
    rng = random.Random(f"{seed}:{salt}")  # noqa: S311 - reproducible lengths, not secrets
    return [rng.randint(lo, hi) for _ in range(count)]


def words(seed: int, index: int, n: int) -> str:
    rng = random.Random(f"{seed}:{index}")  # noqa: S311 - reproducible text, not secrets
    return " ".join(rng.choice(WORDS) for _ in range(max(n, 1)))


def _count(data: object) -> int | None:
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def tokenize(
    session: aiohttp.ClientSession, base_url: str, model: str, text: str
) -> int | None:
    """The server's token count of `text`, or None when it has no usable /tokenize. NoAnswer
    when it took the request but gave no whole answer in the session's time (timed out, cut
    short, redirected): falling back to a guessed length then would be silent and wrong."""
    # vLLM and SGLang read "prompt", llama-server "content"; each ignores the other.
    body: dict[str, object] = {"model": model, "prompt": text, "content": text}
    answer = await request_json(session, "POST", base_url.rstrip("/") + "/tokenize", body)
    if answer.broken:
        raise NoAnswer(
            f"POST {show(answer.url)}: {answer.error}",
            "check that the server answers at --target directly (no redirect) and in time",
        )
    return _count(answer.data) if answer.ok else None


@dataclass
class Maker:
    """Makes prompts against one server and learns as it goes: the words-per-token ratio (kept
    for every later prompt and point of the workload) and whether /tokenize works (asked until
    it fails once). `calls` counts the /tokenize round trips made."""

    session: aiohttp.ClientSession | None
    base_url: str
    model: str
    ratio: float = 1.0
    can_tokenize: bool = True
    calls: int = 0
    #: /tokenize answered at least once: a later failure is retried at the next point.
    worked: bool = False
    _counted: dict[str, int | None] = field(default_factory=dict)

    def rebind(self, session: aiohttp.ClientSession | None) -> None:
        """Use `session` from now on (one a point); a server whose /tokenize worked before is
        asked again after a failure, one that never answered is not."""
        self.session = session
        if session is not None and (self.worked or self.calls == 0):
            self.can_tokenize = True

    async def count(self, text: str) -> int | None:
        """The server's token count of `text` (asked once a text), None without /tokenize."""
        if text in self._counted:
            return self._counted[text]
        got = None
        if self.can_tokenize and self.session is not None:
            self.calls += 1
            got = await tokenize(self.session, self.base_url, self.model, text)
            self.can_tokenize = got is not None
            self.worked = self.worked or got is not None
        if len(self._counted) < 4096:
            self._counted[text] = got
        return got

    async def prompt(
        self, seed: int, index: int, input_tokens: int, prefix: Prompt | None = None
    ) -> Prompt:
        """A prompt of `input_tokens` tokens: `prefix`'s text, then fresh words."""
        head = prefix.text + " " if prefix is not None else ""
        fresh = input_tokens - (prefix.tokens if prefix is not None else 0)
        n_words = max(1, round(fresh * self.ratio))
        best: tuple[int, str, int] | None = None  # (distance, text, tokens)
        for _ in range(MAX_ROUNDS):
            text = head + words(seed, index, n_words)
            got = await self.count(text)
            if got is None:
                break
            if best is None or abs(got - input_tokens) < best[0]:
                best = (abs(got - input_tokens), text, got)
            if got in (input_tokens, 0):
                break
            step = round(n_words * input_tokens / got) - n_words
            # Step by at least one word, so a tokenizer that merges words still converges.
            n_words = max(1, n_words + (step or (1 if got < input_tokens else -1)))
        if best is None:
            return Prompt(
                head + words(seed, index, n_words), len(head.split()) + n_words, "approximate"
            )
        if best[0]:
            best = await self._trim(input_tokens, best)
        fresh_words = len(best[1].split()) - len(head.split())
        if best[2] and fresh_words > 0:
            fresh_tokens = best[2] - (prefix.tokens if prefix is not None else 0)
            self.ratio = fresh_words / max(fresh_tokens, 1)
        return Prompt(best[1], best[2], "tokenize")

    async def _trim(self, input_tokens: int, best: tuple[int, str, int]) -> tuple[int, str, int]:
        """Closer than a word: where a word is several tokens (a character-level tokenizer, or a
        rare word), one more word, then characters cut from the end until the count fits."""
        text = best[1] + " " + " ".join(WORDS[:2]) if best[2] < input_tokens else best[1]
        for _ in range(MAX_TRIM):
            text = text[:-1]
            if not text:
                break
            got = await self.count(text)
            if got is None:
                break
            if abs(got - input_tokens) < best[0]:
                best = (abs(got - input_tokens), text, got)
            if got <= input_tokens:
                break
        return best


async def make_prompts(
    session: aiohttp.ClientSession | None,
    base_url: str,
    model: str,
    input_tokens: int,
    count: int,
    seed: int,
    *,
    lengths: list[int] | None = None,
    prefix: Prompt | None = None,
    maker: Maker | None = None,
) -> list[Prompt]:
    """`count` fresh prompts of `input_tokens` tokens (or `lengths[i]` each), seeded by `seed`;
    ask the server's tokenizer when `session`. Pass a `maker` to keep what it learnt."""
    maker = maker or Maker(session, base_url, model)
    return [
        await maker.prompt(seed, index, lengths[index] if lengths else input_tokens, prefix)
        for index in range(count)
    ]
