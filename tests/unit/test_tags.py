"""Every playbook tag the doctor names exists: `ansible-playbook playbooks/site.yml --list-tags`.

A remediation saying "run --tags host_devices" must work when pasted (issue 9, section 6). The
tags below are promised by open issues whose roles are being built; each is an expected failure
until its role lands, and the test fails as soon as it exists, so the entry is deleted then.
No other tag may be missing, and none is skipped silently.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ct200_tools.doctor.checks import CHECKS, run_checks
from ct200_tools.facts import loads

ROOT = Path(__file__).parents[2]

#: Tags the doctor names whose roles are promised by open issues. Delete an entry when its
#: role is merged (the test then fails until you do).
PROMISED = {}


@functools.cache
def listed_tags() -> frozenset[str]:
    """The tags ansible-playbook lists for site.yml, run from this venv against the example
    inventory."""
    ansible = Path(sys.executable).parent / "ansible-playbook"
    r = subprocess.run(
        [str(ansible), "playbooks/site.yml", "-i", "inventory/ct200", "--list-tags"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    tags: set[str] = set()
    for group in re.findall(r"TAGS: \[([^\]]*)\]", r.stdout):
        tags.update(t.strip() for t in group.split(",") if t.strip())
    assert tags, r.stdout  # the parse found the listing, so a missing tag means missing
    return frozenset(tags)


def named_tags() -> dict[str, set[str]]:
    """Every tag a check declares, and every tag its remediations name on the fixtures (the
    test_check_examples.py keeps remediation tags within the declared ones)."""
    named: dict[str, set[str]] = {}
    for c in CHECKS:
        for t in c.tags:
            named.setdefault(t, set()).add(c.id)
    for path in sorted((ROOT / "tests" / "fixtures" / "facts").glob("*.json")):
        for f in run_checks(loads(path.read_text()), None):
            if f.remediation is not None and f.remediation.tag:
                named.setdefault(f.remediation.tag, set()).add(f.id)
    return named


@pytest.mark.parametrize("tag", sorted(named_tags()))
def test_named_tag_exists_in_site_yml(tag: str) -> None:
    if tag in PROMISED:
        if tag in listed_tags():
            pytest.fail(f"tag {tag} exists now: delete it from PROMISED in {__file__}")
        pytest.xfail(f"promised by {PROMISED[tag]}; not in site.yml yet")
    assert tag in listed_tags(), (
        f"{sorted(named_tags()[tag])} name playbook tag {tag!r}, which "
        "playbooks/site.yml does not have"
    )


def test_promised_tags_are_still_named() -> None:
    """An allow-list entry for a tag no check names any more is stale."""
    assert set(PROMISED) <= set(named_tags())
