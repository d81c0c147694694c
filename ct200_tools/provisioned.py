"""Which inventory provisioned this machine, as site.yml recorded it (roles/ct200_tools,
tasks/spec.yml), so every playbook command this machine prints is whole: pasted on the
controller, it runs against this machine."""

from __future__ import annotations

import os
import shlex
from typing import Final

from ct200_tools.untrusted import UntrustedInputError, load_json

PROVISIONED: Final = "/etc/ct200/provisioned.json"
#: The machine's copy of the site spec, which site.yml and recover.yml write from the inventory.
INSTALLED_SPEC: Final = "/etc/ct200/site.yml"


def playbook_command(playbook: str, *extra: str, path: str = PROVISIONED) -> str:
    """`cd CHECKOUT && ansible-playbook -i INVENTORY -e @FILE... PLAYBOOK --limit HOST,localhost
    EXTRA...` in backquotes, from the record; without one, the command with what to fill in, said
    plainly. localhost stays in the limit: the playbooks validate the spec there
    (playbooks/validate.yml) and every role reads that result. The extra-vars files of the
    provisioning run come along (the spec may live in one): without them the pasted command would
    apply another spec (issue 33). A record from before they were recorded says so."""
    try:
        got = load_json(path, "the provisioning record", 64 * 1024, "run site.yml once more")
    except (UntrustedInputError, OSError):
        got = None
    tail = "".join(f" {shlex.quote(e)}" for e in extra)
    if isinstance(got, dict):
        checkout, host, inventory = got.get("checkout"), got.get("host"), got.get("inventory")
        raw = inventory if isinstance(inventory, list) else [inventory]
        sources = [i for i in raw if isinstance(i, str) and i]
        recorded = got.get("extra_vars")
        files = (
            [f for f in recorded if isinstance(f, str) and f] if isinstance(recorded, list) else []
        )
        known = isinstance(recorded, list) and len(files) == len(recorded)
        if (
            isinstance(checkout, str)
            and checkout
            and isinstance(host, str)
            and host
            and sources
            and len(sources) == len(raw)
            and (known or "extra_vars" not in got)
        ):
            # Quoted: these are strings from a file, pasted into a shell.
            dash_i = " ".join(f"-i {shlex.quote(i)}" for i in sources)
            dash_e = "".join(f" -e {shlex.quote('@' + f)}" for f in files) if known else ""
            note = (
                ""
                if known
                else (
                    f" (add the -e @FILE of the run that provisioned it, if any: {path} predates "
                    "recording them; site.yml records them)"
                )
            )
            return (
                f"`cd {shlex.quote(checkout)} && ansible-playbook {dash_i}{dash_e} {playbook} "
                f"--limit {shlex.quote(host + ',localhost')}{tail}` on the controller{note}"
            )
    return (
        f"on the controller, in your ct200-tools checkout, `ansible-playbook -i INVENTORY "
        f"{playbook} --limit HOST,localhost{tail}` with the inventory (and -e @FILE) and host that "
        f"provisioned this machine; it does not know them ({path} is missing or incomplete: "
        "site.yml records it)"
    )


def installed_spec_fix(
    source: str, installed: str = INSTALLED_SPEC, path: str = PROVISIONED
) -> str | None:
    """For an unusable copy of the spec that the playbooks installed (``source`` is it): the
    command that writes it again from the inventory; None for any other spec file, whose own
    issues say what to edit. Editing the machine's copy by hand is not the fix: the next run
    would replace it, and the inventory is the one source of truth."""
    if not source or os.path.abspath(source) != os.path.abspath(installed):
        return None
    return (
        f"{installed} is written from the inventory: correct the spec there if it is wrong, "
        f"then write it again with {playbook_command('playbooks/recover.yml', path=path)}"
    )
