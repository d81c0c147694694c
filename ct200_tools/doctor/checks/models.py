"""models.*: the models the enabled servers serve: staged, marked, and matching their manifest."""

from __future__ import annotations

from dataclasses import dataclass, field

from ct200_tools.doctor.checks.base import (
    Context,
    Outcome,
    Remedy,
    check,
    failed,
    passed,
    plural,
    skipped,
)
from ct200_tools.doctor.checks.staged import model_verdict
from ct200_tools.facts import ModelFacts
from ct200_tools.spec import ModelSpec


def _stage_fix(m: ModelSpec) -> Remedy:
    return Remedy(
        f"restage {m.name} from its persistent copy {m.source} (verified, then swapped in "
        "atomically; --replace only ever replaces a copy ct200-stage made)",
        "container",
        f"ct200-stage stage {m.name} --spec /etc/ct200/site.yml --replace",
        "staging",
    )


@dataclass
class _Sorted:
    bad: list[tuple[ModelSpec, str]] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


def _sort(models: list[ModelSpec], found: dict[str, ModelFacts]) -> _Sorted:
    out = _Sorted()
    for m in models:
        f = found.get(m.name)
        v = model_verdict(f) if f is not None else None
        if v is None or v.state == "unreadable":
            out.unknown.append(m.name)
            if v is not None and v.detail:
                out.evidence.append(f"{m.name}: unreadable: {v.detail}")
            continue
        how = "re-hashed" if v.deep else "marker, sizes and change times"
        out.evidence.append(f"{m.name}: {v.state} ({how}): {v.detail}")
        if v.state == "staged":
            continue
        if v.state == "partial" and v.stage_pid:
            out.running.append(f"{m.name} (pid {v.stage_pid})")
        elif f is not None and f.source_exists is False:
            out.bad.append((m, f"{m.name} is {v.state} and its persistent copy is missing"))
        else:
            out.bad.append((m, f"{m.name} is {v.state}"))
    return out


@check(
    "models.staged",
    "models staged and intact",
    "error",
    needs=("models", "serving"),
    needs_spec=True,
    tags=("staging",),
)
def check_staged(ctx: Context) -> Outcome:
    """Every model a serving server serves (and its declared draft model) is staged by
    ct200-stage: a marker naming the manifest, every file at its size and with the inode, mtime
    and ctime the stager recorded when it published the copy (any write moves ctime, which no
    user can set back, so a same-size change fails too: "changed since it was staged ...:
    content not trusted", one stat per file, content not re-read), and with --deep every chunk
    re-hashed. A marker of an older ct200-stage has no change times: sizes only, and the pass
    says so. The fix restages with `ct200-stage stage NAME --replace`, which swaps out only a
    copy ct200-stage made. The serving servers are those of the serving set
    (/var/lib/ct200/serving.json) when there is one, else the spec's enabled servers; a gate or
    `check --server NAME` judges that server's model and draft only. A partial tree with a
    running stage is a warning; a missing persistent copy says so, since staging never creates
    one. A gate (a server about to start) fails on a model still being staged."""
    models = list(ctx.needed_models())
    if not models:
        return skipped("no serving server needs a model")
    if ctx.facts.models is None:
        why = ctx.facts.unreadable.get("models")
        return skipped(f"models not probed: {why}" if why else "models not probed")
    if not ctx.facts.models:
        return skipped(
            f"the facts hold no model, so {', '.join(m.name for m in models)} cannot be judged: "
            "a snapshot taken without a site spec looks at none; take it with --spec"
        )
    found = {f.name: f for f in ctx.facts.models}
    s = _sort(models, found)
    if s.bad:
        m = s.bad[0][0]
        remedy = _stage_fix(m)
        if found[m.name].source_exists is False:
            manifest = f"/var/lib/ct200/manifests/{m.name}.json"
            remedy = Remedy(
                f"restore the persistent copy {m.source} first (staging never creates it: copy "
                "it back from a backup or download it again), verify it against its manifest, "
                "then stage it",
                "container",
                f"ct200-stage verify {m.source} --manifest {manifest} && "
                f"ct200-stage stage {m.name} --spec /etc/ct200/site.yml --replace",
                "staging",
            )
        return failed("; ".join(why for _, why in s.bad), remedy, *s.evidence)
    if s.running:
        # A server about to start (its gate) cannot load a half-copied model: no-go, not a
        # warning; a machine checked while it stages only warns.
        starting = ctx.scope is not None and not ctx.scope.serving
        return failed(
            f"staging in progress: {', '.join(s.running)}",
            Remedy(
                "wait for the stage to finish (the server's unit starts after its staging unit)",
                "container",
                "ct200-stage status --spec /etc/ct200/site.yml",
                "staging",
            )
            if starting
            else None,
            *s.evidence,
            warn_only=not starting,
        )
    if s.unknown:
        return skipped(f"cannot tell whether {', '.join(s.unknown)} is staged", *s.evidence)
    return passed(
        f"{plural(len(models), 'model')} staged and matching their manifests", *s.evidence
    )
