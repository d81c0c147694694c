"""ct200_extra_vars_files: the extra-vars files (`-e @FILE`) of this ansible-playbook run, as
absolute paths resolved against the directory it runs from, so /etc/ct200/provisioned.json can
record them and the playbook commands the machine prints carry them (issue 33: a printed
recover.yml without the `-e @serving.yml` of the provisioning run applied a spec with no
servers). Inline values (`-e key=value`) are one-off switches, and may be secrets: not recorded.
"""

from __future__ import annotations

import os
from typing import Any

from ansible import context
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: ct200_extra_vars_files
short_description: The -e @FILE files of this run, as absolute paths
description:
  - Each C(-e @FILE) of the ansible-playbook command line, resolved against the directory it
    runs from, in order; inline extra vars are left out.
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[Any]:
        given = context.CLIARGS.get("extra_vars", ()) or ()
        files = [str(e)[1:] for e in given if isinstance(e, str) and e.startswith("@")]
        # wantlist: one list, not one item per file.
        return [[os.path.abspath(os.path.expanduser(f)) for f in files]]
