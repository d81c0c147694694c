"""What each point sends: its warm-up and counted requests, fresh for every point and run.

Made-up prompts are seeded by the point's `prompt_seed` (the plan's seed, the run id and the
point's key: ct200_tools.bench.prompts), warm-up included, so no point is served from a cache
that an earlier point or run filled. A dataset's entries are taken in a shuffled order seeded
by the run and the workload, each point going on where the points before it stopped, so
entries repeat only when the run sends more requests than the dataset has (the point's
`cache_flag` then shows what the server took from its cache). Lengths drawn from `{min, max}`
use the point's seed. Each workload keeps one prompts.Maker for the run: what it learnt of the
server's tokenizer serves every point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ct200_tools.bench import client, datasets, prompts
from ct200_tools.bench.http import INFO_TIMEOUT_S, new_session
from ct200_tools.bench.metrics import CHAT_TEMPLATE_SLACK, cache_slack, spread
from ct200_tools.bench.plan import PlanError
from ct200_tools.bench.target import Auth
from ct200_tools.bench.workload import FROM_DATASET, MAX_TOKENS, Span, Workload
from ct200_tools.spec.model import SpecIssue


@dataclass(frozen=True)
class Prepared:
    requests: list[client.Request]
    #: The point's workload record: the plan's fields and how this point's requests were made.
    workload: dict[str, object]
    #: Prompt tokens each counted request may find in the server's cache (metrics.cache_flag).
    cache_allowed: list[int]


def _lengths(length: int | Span, count: int, seed: int, salt: str) -> tuple[list[int], str]:
    if isinstance(length, Span):
        return prompts.draw(length.min, length.max, count, seed, salt), "uniform"
    return [length] * count, "fixed"


@dataclass
class Feed:
    """One run's prompt maker for one target: call `point` for each point, in order."""

    target: str
    model: str
    run_id: str
    plan_seed: int
    warmup: int
    #: "" on a fresh run; a resumed run's points draw other prompts than the killed run may have
    #: sent for them ("resumed-after-N": the points recorded before).
    attempt: str = ""
    #: Each /tokenize request's bound (the run's --timeout, at most http.INFO_TIMEOUT_S).
    timeout_s: float = INFO_TIMEOUT_S
    #: The API key sent with every request (--api-key-env), if any.
    auth: Auth | None = None
    _makers: dict[str, prompts.Maker] = field(default_factory=dict)
    _prefixes: dict[str, prompts.Prompt] = field(default_factory=dict)
    #: Requests of each dataset workload taken by the points before (dataset offsets).
    _taken: dict[str, int] = field(default_factory=dict)
    #: Reference answers' lengths, by workload and entry: (tokens, how they were counted).
    _references: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)

    def skip(self, w: Workload) -> None:
        """A point recorded before (--resume): its dataset entries stay taken."""
        if w.prompts is not None:
            self._taken[w.name] = self._taken.get(w.name, 0) + self.warmup + w.requests

    async def point(self, w: Workload, key: str) -> Prepared:
        seed = prompts.prompt_seed(self.plan_seed, self.run_id + self.attempt, key)
        total = self.warmup + w.requests
        maker = self._makers.setdefault(w.name, prompts.Maker(None, self.target, self.model))
        before = maker.calls
        async with new_session(self.timeout_s, self.auth) as session:
            maker.rebind(session)
            if w.prompts is not None:
                reqs, record = await self._from_dataset(w, maker, total, seed)
            else:
                reqs, record = await self._made_up(w, maker, total, seed)
            allowed = await self._allowed(w, maker, reqs[self.warmup :])
            maker.rebind(None)
        record = {
            **w.as_record(),
            **record,
            "prompt_seed": seed,
            "requested_output_tokens": spread([r.max_tokens for r in reqs[self.warmup :]]),
            "tokenize_calls": maker.calls - before,
            # What cache_flag allows beyond what is shared on purpose (metrics.cache_slack).
            "cache_slack_tokens": cache_slack(maker.ratio),
            "cache_allowed_tokens_max": max(allowed, default=0),
        }
        return Prepared(reqs, record, allowed)

    async def _allowed(
        self, w: Workload, maker: prompts.Maker, reqs: list[client.Request]
    ) -> list[int]:
        """Prompt tokens each request may find in the server's cache: the shared prefix, a
        chat template's tokens and a system message other entries share (counted by the
        server where it can), and the slack of chance (metrics.cache_slack)."""
        base = cache_slack(maker.ratio) + w.shared_prefix_tokens
        out = []
        for r in reqs:
            allowed = base
            if r.messages is not None:
                allowed += CHAT_TEMPLATE_SLACK
                if r.messages[0][0] == "system" and len(r.messages) > 1:
                    text = r.messages[0][1]
                    tokens = await maker.count(text)
                    allowed += CHAT_TEMPLATE_SLACK + (
                        tokens if tokens is not None else round(len(text.split()) / maker.ratio)
                    )
            out.append(allowed)
        return out

    async def _made_up(
        self, w: Workload, maker: prompts.Maker, total: int, seed: int
    ) -> tuple[list[client.Request], dict[str, object]]:
        assert w.input_tokens is not None  # noqa: S101 - the plan's rule: no prompts, a length
        prefix = None
        if w.shared_prefix_tokens:
            if w.name not in self._prefixes:
                at = prompts.prompt_seed(self.plan_seed, self.run_id, f"{w.name}/shared-prefix")
                self._prefixes[w.name] = await maker.prompt(at, 0, w.shared_prefix_tokens)
            prefix = self._prefixes[w.name]
        ins, _ = _lengths(w.input_tokens, total, seed, "input")
        made = [await maker.prompt(seed, i, ins[i], prefix) for i in range(total)]
        if w.output_tokens == FROM_DATASET:  # refused by the plan without a dataset
            raise AssertionError(w.output_tokens)
        outs, out_method = _lengths(w.output_tokens, total, seed, "output")
        chat = w.endpoint == "chat"
        reqs = [
            client.Request(p.text, n, (("user", p.text),) if chat else None)
            for p, n in zip(made, outs, strict=True)
        ]
        methods = sorted({p.method for p in made})
        return reqs, {
            "prompt_length_method": "+".join(methods) or "approximate",
            "output_length_method": out_method,
            "requested_input_tokens": spread([p.tokens for p in made[self.warmup :]]),
        }

    async def _from_dataset(
        self, w: Workload, maker: prompts.Maker, total: int, seed: int
    ) -> tuple[list[client.Request], dict[str, object]]:
        assert w.prompts is not None  # noqa: S101 - the caller's test
        try:
            data = datasets.load(w.prompts)  # read and checked with the plan; cached
        except datasets.DatasetError as exc:  # changed since: refused as when the plan was read
            raise PlanError(
                [SpecIssue(f"workloads[{w.name}].prompts", exc.message, exc.fix)], w.prompts
            ) from None
        n = len(data.entries)
        order = list(range(n))
        random.Random(  # noqa: S311 - a reproducible order, not secrets
            prompts.prompt_seed(self.plan_seed, self.run_id, f"{w.name}/dataset")
        ).shuffle(order)
        offset = self._taken.get(w.name, 0)
        self._taken[w.name] = offset + total
        picked = [order[(offset + i) % n] for i in range(total)]
        methods: set[str] = set()
        if w.output_tokens == FROM_DATASET:
            outs = []
            for i in picked:
                tokens, how = await self._reference(w.name, i, data.entries[i], maker)
                outs.append(tokens)
                methods.add(how)
        else:
            outs, how = _lengths(w.output_tokens, total, seed, "output")
            methods.add(how)
        chat = w.endpoint == "chat"
        reqs = []
        for i, out in zip(picked, outs, strict=True):
            e = data.entries[i]
            messages = (e.messages or (("user", e.prompt),)) if chat else None
            reqs.append(client.Request(e.prompt, out, messages))
        return reqs, {
            "prompt_length_method": "file",
            "output_length_method": "+".join(sorted(methods)),
            "dataset": data.describe(),
            "dataset_offset": offset,
            # Entries sent again in this run: the server may serve them from its cache.
            "dataset_repeats": max(0, offset + total - n),
        }

    async def _reference(
        self, name: str, index: int, entry: datasets.Entry, maker: prompts.Maker
    ) -> tuple[int, str]:
        """The reference answer's length: its stated count, else the server's count of its
        text (/tokenize), else its word count; each entry counted once a run."""
        key = (name, index)
        if key not in self._references:
            if entry.output_tokens is not None:
                found = (entry.output_tokens, "dataset")
            else:
                text = entry.reference or ""
                got = await maker.count(text) if text else None
                found = (got, "tokenize") if got else (len(text.split()), "words")
            self._references[key] = (min(max(found[0], 1), MAX_TOKENS), found[1])
        return self._references[key]
