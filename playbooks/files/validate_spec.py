"""Validate the site spec given as JSON on stdin; used by playbooks/validate.yml.

Valid: exit 0 and print one JSON object for the play to export to the other plays:
  site           the canonical spec (every field, sizes with their unit), as spec_to_dict writes it
  needed_models  the models to stage, in spec order: SiteSpec.needed_models(), each as under models
  warnings       the spec's warnings, one line each
Invalid: exit 1 and print every issue (path, message, fix), one a line.
"""

import json
import sys

from ct200_tools.spec import MAX_BYTES, SpecError, model_to_dict, spec_to_dict, validate

SOURCE = "inventory ct200_site"


def main() -> int:
    # Bounded like a spec file: Ansible expands YAML aliases before it sends the JSON.
    text = sys.stdin.read(4 * MAX_BYTES + 1)
    if len(text) > 4 * MAX_BYTES:
        print(f"error: {SOURCE}: more than {4 * MAX_BYTES >> 10} KiB as JSON: not a site spec")
        return 1
    try:
        spec = validate(json.loads(text), source=SOURCE)
    except SpecError as exc:
        for issue in exc.issues:
            print(f"{issue.severity}: {issue}")
        return 1
    except (ValueError, RecursionError) as exc:  # not JSON: the play sends to_json, so a bug
        print(f"error: {SOURCE}: not JSON: {exc}")
        return 1
    result = {
        "site": spec_to_dict(spec),
        "needed_models": [model_to_dict(m) for m in spec.needed_models()],
        "warnings": [str(w) for w in spec.warnings],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
