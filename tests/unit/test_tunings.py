"""The tunings' table (ct200_tools/tunings.py) is whole: each entry says what its kind needs,
its default is one of its values, keys and check ids are unique, and the spec, the export and
the registry follow it (a tuning added there is everywhere, with nothing else written)."""

from __future__ import annotations

import typing

from ct200_tools.doctor.checks import BY_ID, CHECK_IDS
from ct200_tools.doctor.checks.base import FactName
from ct200_tools.doctor.checks.causes import CAUSES
from ct200_tools.doctor.checks.tune import BY_APPLY, JUDGES
from ct200_tools.facts import KernelFacts
from ct200_tools.spec import TuningSpec, spec_to_dict, validate
from ct200_tools.spec.schema import TUNING
from ct200_tools.tunings import TUNINGS, export
from tests.unit.spec_helpers import changed


def test_each_entry_is_whole() -> None:
    assert len({t.key for t in TUNINGS}) == len(TUNINGS)
    assert len({t.check for t in TUNINGS}) == len(TUNINGS)
    facts = set(typing.get_args(FactName))
    for t in TUNINGS:
        assert t.default is None or t.default in t.values, t.key
        assert t.example.startswith(f"{t.key}: "), t.key
        assert set(t.needs) <= facts and t.doc and t.host_doc and t.cause, t.key
        assert (t.apply == "sysfs") == (t.sysfs is not None), t.key
        assert (t.apply == "sysctl") == (t.sysctl is not None), t.key
        # A kind without a generic judgement needs its own, registered by key.
        assert t.key in JUDGES or t.apply in BY_APPLY, t.key
        assert t.fact is None or t.fact in KernelFacts.__dataclass_fields__, t.key


def test_the_spec_the_export_and_the_registry_follow_the_table() -> None:
    assert list(TUNING) == [t.key for t in TUNINGS]
    assert TuningSpec().plain() == {t.key: t.default for t in TUNINGS}
    site = validate(changed({}))
    plain = spec_to_dict(site)["tuning"]
    assert isinstance(plain, dict) and list(plain) == [t.key for t in TUNINGS]
    assert [e["key"] for e in export(site.tuning.plain())] == [t.key for t in TUNINGS]
    for t in TUNINGS:
        for prefix in ("tune", "host"):
            c = BY_ID[f"{prefix}.{t.check}"]
            assert c.needs_spec and c.tags == (t.tag,) and c.gpu_only == t.gpu_only
        assert any(r.effect == f"tune.{t.check}" and r.root == f"host.{t.check}" for r in CAUSES)
    # Every null is "not managed", every absent key its default; a value outside is refused.
    off = validate(changed({f"tuning.{t.key}": None for t in TUNINGS}))
    assert all(v is None for v in off.tuning.plain().values())
    assert len([c for c in CHECK_IDS if c.startswith("tune.")]) == len(TUNINGS)
