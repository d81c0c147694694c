"""Generate docs/checks.md from the check registry: `python -m ct200_tools.docs > docs/checks.md`.

The registry is the single source; tests/unit/test_checks.py fails when the file is stale.
"""

from __future__ import annotations

from ct200_tools.checks import CHECKS

HEADER = """\
# ct200-doctor checks

Generated from `ct200_tools/checks/__init__.py` by `make docs`; do not edit by hand.

Every check has a stable id, a severity (what a failure counts as: `error` fails the run with
exit 2, `warning` shows as `warn` and fails only with `--strict`), and on failure a remediation:
what to do, where (`host`, `container` or `this machine`), the exact command or config line,
and the playbook tag that applies it
(`ansible-playbook -i inventory/SITE playbooks/site.yml --tags TAG`).
A check that cannot read what it needs is `skip` with the reason, never a failure.
Select with `--only ID` / `--skip ID` (an id or a prefix such as `dev`).

| id | severity | needs spec | checks |
|---|---|---|---|
"""


def render() -> str:
    rows = [
        f"| `{c.id}` | {c.severity} | {'yes' if c.needs_spec else 'no'} | {c.title} |"
        for c in CHECKS
    ]
    sections = [f"## `{c.id}`\n\n{c.title} ({c.severity}).\n\n{c.doc}\n" for c in CHECKS]
    return HEADER + "\n".join(rows) + "\n\n" + "\n".join(sections)


if __name__ == "__main__":
    print(render(), end="")
