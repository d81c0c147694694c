"""ct200_validate_spec, the filter of playbooks/validate.yml: the site spec, sent as JSON
(`ct200_site | to_json`, so Ansible has expanded every template and YAML alias), validated by
ct200_tools.spec in the controller's own process (no interpreter started for it).

Valid: one mapping for the play to export to the other plays:
  site           the canonical spec (every field, sizes with their unit), as spec_to_dict writes it
  needed_models  the models to stage, in spec order: SiteSpec.needed_models(), each as under models
  warnings       the spec's warnings, one line each
  units          every unit the project installs (ct200_tools.units), keyed by step: name, role,
                 boot order, the spec field that turns it on and whether this spec does
  host_chain     the host's boot units this spec installs, in start order: [{name, unit}]
  device_nodes   the host's nodes the container is given (GpuSpec.device_nodes)
  mrrs           the PCIe MRRS sizes and their Device Control codes: [{bytes, code}]
  tunings        every host tuning of ct200_tools.tunings with this spec's value (null: not
                 managed), how the host applies it, and for sysfs its glob and tmpfiles line
  paths          where ct200-tools reads and writes on the machines, as its code names them:
                 spec (/etc/ct200/site.yml), serving (serving.json), textfile and host_textfile
                 (the boot reports), tmpfiles (the host's sysfs tunings, systemd-tmpfiles lines)
Invalid: the task fails with every issue (path, message, fix), one a line; no ct200_site (null):
with where to put it.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError

from ct200_tools import tunings, units
from ct200_tools.host import chain as hostchain
from ct200_tools.serve import chain
from ct200_tools.serve.serving import STATE_PATH
from ct200_tools.spec import (
    DEFAULT_SPEC_PATH,
    MAX_BYTES,
    MRRS_SIZES,
    SpecError,
    model_to_dict,
    mrrs_code,
    spec_to_dict,
    validate,
)

SOURCE = "inventory ct200_site"
NO_SPEC = (
    "ct200_site is not defined for localhost.\n"
    "fix: pass your site's inventory with -i inventory/<site> and put the site spec in its "
    "group_vars (see inventory/ct200/group_vars/all/ct200_site.yml)."
)


def ct200_validate_spec(text: object) -> dict[str, Any]:
    if not isinstance(text, str):
        raise AnsibleFilterError(
            "ct200_validate_spec: pass the spec as JSON (ct200_site | to_json)"
        )
    # Bounded like a spec file: Ansible expands YAML aliases before it writes the JSON.
    if len(text) > 4 * MAX_BYTES:
        raise AnsibleFilterError(
            f"error: {SOURCE}: more than {4 * MAX_BYTES >> 10} KiB as JSON: not a site spec"
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # to_json wrote it, so a bug
        raise AnsibleFilterError(f"error: {SOURCE}: not JSON: {exc}") from None
    if data is None:
        raise AnsibleFilterError(NO_SPEC)
    try:
        spec = validate(data, source=SOURCE)
    except SpecError as exc:
        lines = [f"{SOURCE} is not a valid site spec:"]
        lines += [f"{issue.severity}: {issue}" for issue in exc.issues]
        raise AnsibleFilterError("\n".join(lines)) from None
    return {
        "site": spec_to_dict(spec),
        "needed_models": [model_to_dict(m) for m in spec.needed_models()],
        "warnings": [str(w) for w in spec.warnings],
        "units": units.export(spec),
        "host_chain": units.host_chain(spec),
        "device_nodes": list(spec.gpus.device_nodes),
        "mrrs": [{"bytes": size, "code": mrrs_code(size)} for size in MRRS_SIZES],
        "tunings": tunings.export(spec.tuning.plain()),
        "paths": {
            "spec": DEFAULT_SPEC_PATH,
            "serving": STATE_PATH,
            "textfile": chain.TEXTFILE,
            "host_textfile": hostchain.TEXTFILE,
            "tmpfiles": tunings.TMPFILES_FILE,
        },
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ct200_validate_spec": ct200_validate_spec}
