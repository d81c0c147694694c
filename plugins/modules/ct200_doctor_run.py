#!/usr/bin/python
"""Ansible module ct200_doctor_run: run `ct200-doctor check --json` and hand back what it said.

It only runs and reports: whether the doctor is installed, its exit code and output. Judging the
output (a result, a failure, a broken doctor) is ct200_tools/doctor/fleet.py's, on the
controller, so that one fleet table is rendered from every host's answer.
"""

from __future__ import annotations

import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ct200_doctor_run
short_description: Run ct200-doctor check --json on the target and return its exit code and output
description:
  - Looks for the doctor (I(command) on the PATH, else in C(/usr/local/bin) and the tools'
    venv C(/opt/ct200/venv/bin), where the ct200_tools role installs it) and runs
    C(ct200-doctor check --json) with the given arguments, as an argv (no shell).
  - >-
    Never fails because of what the doctor found, nor because it is missing or timed out; the
    result says so (I(installed), I(rc), I(timed_out)), and playbooks/doctor.yml judges every
    host's result together on the controller (ct200_tools/doctor/fleet.py).
  - Read-only (the doctor only reads), so it runs in check mode too.
version_added: "0.1.0"
author: ct200-tools
options:
  command:
    description: The doctor's executable, a name looked up as above or an absolute path.
    type: str
    default: ct200-doctor
  only:
    description: Checks to run, ids or prefixes (C(--only)); empty runs all.
    type: list
    elements: str
    default: []
  args:
    description: More arguments after C(check --json), e.g. C([--spec, /path/site.yml]).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds the doctor may take before it is killed and reported as timed out.
    type: float
    default: 300
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Run the doctor.
  ct200_doctor_run:
    only: [mem, models]
  register: doctor
"""

RETURN = r"""
installed:
  description: Whether the doctor was found.
  returned: always
  type: bool
doctor:
  description: The doctor that ran (null when not found).
  returned: always
  type: str
argv:
  description: The command line that ran.
  returned: always
  type: list
  elements: str
exit_code:
  description: >-
    Its exit code (0 ok, 1 warnings, 2 failures or bad input, 3 broke); null when it did not run
    or timed out. Not named C(rc), which Ansible would take for a failed task.
  returned: always
  type: int
stdout:
  description: The JSON report (or whatever it printed).
  returned: always
  type: str
stderr:
  description: Its standard error.
  returned: always
  type: str
timed_out:
  description: True when it ran past I(timeout) and was killed.
  returned: always
  type: bool
duration_s:
  description: Seconds it ran.
  returned: always
  type: float
"""

#: Where the ct200_tools role puts the doctor when the PATH of a non-login shell has neither.
SEARCH = ["/usr/local/bin", "/opt/ct200/venv/bin"]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "command": {"type": "str", "default": "ct200-doctor"},
            "only": {"type": "list", "elements": "str", "default": []},
            "args": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "float", "default": 300},
        },
        supports_check_mode=True,
    )
    p = module.params
    command = p["command"]
    if os.path.isabs(command):
        path = command if os.access(command, os.X_OK) else None
    else:
        path = module.get_bin_path(command, opt_dirs=SEARCH)
    only = [f"--only={o}" for o in p["only"] if o]
    argv = [path or command, "check", "--json", *only, *p["args"]]
    # "doctor", not "path": Ansible would add that file's stat to the result.
    out = {"changed": False, "installed": path is not None, "doctor": path, "argv": argv}
    empty = {"exit_code": None, "stdout": "", "stderr": "", "timed_out": False, "duration_s": 0.0}
    if path is None:
        module.exit_json(**out, **empty)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=p["timeout"],
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        took = round(time.monotonic() - started, 3)
        module.exit_json(**out, **{**empty, "timed_out": True, "duration_s": took})
    except OSError as exc:
        took = round(time.monotonic() - started, 3)
        why = f"cannot run {path}: {exc}"
        module.exit_json(**out, **{**empty, "stderr": why, "duration_s": took})
    module.exit_json(
        **out,
        exit_code=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        timed_out=False,
        duration_s=round(time.monotonic() - started, 3),
    )


if __name__ == "__main__":
    main()
