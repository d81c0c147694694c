"""Validate the site spec given as JSON on stdin; used by playbooks/validate.yml.

Exit 0 with warnings printed, or exit 1 with every issue (path, message, fix) printed.
"""

import json
import sys

from ct200_tools.spec import SpecError, validate


def main() -> int:
    try:
        spec = validate(json.load(sys.stdin), source="inventory ct200_site")
    except SpecError as exc:
        for issue in exc.issues:
            print(f"{issue.severity}: {issue}")
        return 1
    for warning in spec.warnings:
        print(f"warning: {warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
