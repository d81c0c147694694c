#!/usr/bin/python
"""Ansible module ct200_files: a role's small text files (units, drop-ins, scripts) in one call.

Why it exists: each ansible.builtin.template or copy task costs two module runs on the target
(stat, then file for the attributes), about 0.3 s of CPU each on a small machine, and a converged
re-run of site.yml is mostly such round trips (benchmarks/ansible). One call per role installs
all of a role's files, with the same guarantees: whole files or none, attributes kept in line,
check mode and --diff.
"""

from __future__ import annotations

import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ct200_fsutil import write_atomic

DOCUMENTATION = r"""
module: ct200_files
short_description: Install small text files and their directories in one module run
description:
  - Makes each file in I(files) hold exactly its I(content) with its I(mode), I(owner) and
    I(group), or be absent (I(state=absent)); and each directory in I(directories) exist with
    its attributes. Directories are made first, in the order given.
  - A changed file is written to a temporary file in the same directory, flushed to disk and
    renamed over the old one, so a crash leaves the old file or the new one, never a part.
  - Refuses, before any change, a destination that exists and is not a regular file (a
    directory, a symbolic link, a device); it never follows or replaces what it did not make.
  - For text that is no secret (units, scripts, drop-ins); the content is a module argument,
    which C(-vvv) shows. Install secrets with ansible.builtin.template and no_log.
version_added: "0.1.0"
author: ct200-tools
options:
  files:
    description: The files, in the order they are written.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file.
        type: path
        required: true
      content:
        description: The whole text of the file (UTF-8). Required unless I(state=absent).
        type: str
      state:
        description: C(file) writes it; C(absent) removes it if it is there.
        type: str
        choices: [file, absent]
        default: file
      mode:
        description: Octal mode as a string, e.g. C("0755"); default I(mode).
        type: str
      owner:
        description: Owner; default I(owner).
        type: str
      group:
        description: Group; default I(group).
        type: str
  directories:
    description: Directories to make (with parents) before the files, with their attributes.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      mode:
        description: Octal mode as a string; default I(directory_mode).
        type: str
      owner:
        description: Owner; default I(owner).
        type: str
      group:
        description: Group; default I(group).
        type: str
  mode:
    description: The mode of a file that names none.
    type: str
    default: "0644"
  directory_mode:
    description: The mode of a directory that names none.
    type: str
    default: "0755"
  owner:
    description: The owner of a file or directory that names none.
    type: str
    default: root
  group:
    description: The group of a file or directory that names none.
    type: str
    default: root
  backup:
    description:
      - Before a file's content is replaced, keep the previous content beside it
        (C(<dest>.<pid>.<time>~), as ansible.builtin.template's I(backup) does) and return its path
        in I(backups), so a caller can put it back (the inference_servers role rolls a server
        back so). A file that was absent maps to null.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Install the unit and its script.
  ct200_files:
    directories:
      - path: /usr/local/lib/ct200
    files:
      - dest: /etc/systemd/system/ct200-pcie-tune.service
        content: "{{ lookup('ansible.builtin.template', 'ct200-pcie-tune.service.j2') }}"
      - dest: /usr/local/sbin/ct200-pcie-tune
        content: "{{ lookup('ansible.builtin.file', 'ct200-pcie-tune', rstrip=false) }}"
        mode: "0755"
  register: installed
  notify: Reload systemd
"""

RETURN = r"""
changed_paths:
  description: Files and directories made, rewritten, removed or given other attributes
    (in check mode, those that would be).
  returned: always
  type: list
  elements: str
content_changed:
  description: Files whose content was written or that were removed (not attributes alone).
  returned: always
  type: list
  elements: str
backups:
  description: With I(backup), each file of I(content_changed) -> the path of its previous
    content, or null where it was absent (not written in check mode).
  returned: always
  type: dict
"""


class Refused(Exception):
    """A destination the module will not touch; nothing has been changed yet."""


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _read(path: str, st: os.stat_result | None) -> bytes | None:
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{path} exists and is not a regular file: not replaced (remove it first)")
    with open(path, "rb") as fh:
        return fh.read()


def _attrs(module: AnsibleModule, path: str, item: dict) -> bool:
    wanted = {"mode": item["mode"], "owner": item["owner"], "group": item["group"]}
    args = module.load_file_common_arguments(wanted, path=path)
    return bool(module.set_fs_attributes_if_different(args, False))


ATTRS = {"mode": {"type": "str"}, "owner": {"type": "str"}, "group": {"type": "str"}}
ARGUMENT_SPEC = {
    "files": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "dest": {"type": "path", "required": True},
            "content": {"type": "str"},
            "state": {"type": "str", "choices": ["file", "absent"], "default": "file"},
            **ATTRS,
        },
        "required_if": [("state", "file", ("content",))],
    },
    "directories": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {"path": {"type": "path", "required": True}, **ATTRS},
    },
    "mode": {"type": "str", "default": "0644"},
    "directory_mode": {"type": "str", "default": "0755"},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
    "backup": {"type": "bool", "default": False},
}


class Run:
    """One run: what changed so far (also what a failure half-way reports)."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.changed_paths: list[str] = []
        self.content_changed: list[str] = []
        self.backups: dict[str, str | None] = {}
        self.diffs: list[dict[str, str]] = []

    def fail(self, msg: str) -> None:
        self.module.fail_json(
            msg=msg,
            changed=bool(self.changed_paths),
            changed_paths=self.changed_paths,
            content_changed=self.content_changed,
            backups=self.backups,
        )

    def directory(self, item: dict) -> None:
        path = item["path"]
        made = not os.path.isdir(path)
        if made:
            self.diffs.append({"before_header": path, "before": "absent\n", "after": "directory\n"})
            if not self.module.check_mode:
                os.makedirs(path, int(item["mode"], 8))
        # Attributes also on a directory just made (makedirs honours the umask, not the owner).
        fixed = os.path.isdir(path) and _attrs(self.module, path, item)
        if made or fixed:
            self.changed_paths.append(path)

    def file(self, item: dict, before: bytes | None, after: bytes | None) -> None:
        dest = item["dest"]
        if before != after:
            parent = os.path.dirname(dest)
            if after is not None and not self.module.check_mode and not os.path.isdir(parent):
                self.fail(f"{parent}: no such directory (list it in directories)")
            self.content_changed.append(dest)
            self.changed_paths.append(dest)
            self.diffs.append(_diff(dest, before, after or b""))
            if self.module.params["backup"] and not self.module.check_mode:
                self.backups[dest] = self.module.backup_local(dest) if before is not None else None
            if not self.module.check_mode:
                if after is None:
                    os.unlink(dest)
                else:
                    # Whole or not at all (ct200_tools/fsutil.py), with its mode before the rename.
                    write_atomic(dest, item["content"], int(item["mode"], 8))
        # Attributes also on a file just written (written by root: the owner and group follow).
        fixed = after is not None and os.path.exists(dest) and _attrs(self.module, dest, item)
        if fixed and dest not in self.changed_paths:
            self.changed_paths.append(dest)


def _defaults(module: AnsibleModule) -> None:
    """Each item's own attributes, else the module's; a bad mode is refused before any change."""
    p = module.params
    for key, default in (("files", "mode"), ("directories", "directory_mode")):
        for item in p[key]:
            item["mode"] = item["mode"] or p[default]
            item["owner"] = item["owner"] or p["owner"]
            item["group"] = item["group"] or p["group"]
            name = item.get("dest") or item["path"]
            if not _octal(item["mode"]):
                module.fail_json(
                    msg=f"mode {item['mode']!r} of {name}: not an octal mode such as "
                    '"0644"; nothing was changed'
                )
            if not os.path.isabs(name):
                module.fail_json(msg=f"{name!r}: not an absolute path; nothing was changed")


def _plan(module: AnsibleModule) -> list[tuple[dict, bytes | None, bytes | None]]:
    """Every destination read and judged before the first change."""
    p = module.params
    plan = []
    try:
        for item in p["directories"]:
            st = _lstat(item["path"])
            if st is not None and not stat.S_ISDIR(st.st_mode):
                raise Refused(f"{item['path']} exists and is not a directory: not replaced")
        for item in p["files"]:
            before = _read(item["dest"], _lstat(item["dest"]))
            after = None if item["state"] == "absent" else item["content"].encode("utf-8")
            plan.append((item, before, after))
    except Refused as exc:
        module.fail_json(msg=f"{exc}; nothing was changed", changed=False)
    except OSError as exc:
        module.fail_json(msg=f"{exc.filename}: {exc.strerror}; nothing was changed", changed=False)
    return plan


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    _defaults(module)
    plan = _plan(module)
    run = Run(module)
    try:
        for item in module.params["directories"]:
            run.directory(item)
        for item, before, after in plan:
            run.file(item, before, after)
    except OSError as exc:
        run.fail(f"{exc.filename}: {exc.strerror}")
    out = {
        "changed": bool(run.changed_paths),
        "changed_paths": run.changed_paths,
        "content_changed": run.content_changed,
        "backups": run.backups,
    }
    if module._diff:
        out["diff"] = run.diffs
    module.exit_json(**out)


def _octal(mode: str) -> bool:
    return 3 <= len(mode) <= 4 and all(c in "01234567" for c in mode)


def _diff(dest: str, before: bytes | None, after: bytes) -> dict[str, str]:
    return {
        "before_header": dest if before is not None else f"{dest} (absent)",
        "after_header": dest,
        "before": (before or b"").decode("utf-8", "replace"),
        "after": after.decode("utf-8", "replace"),
    }


if __name__ == "__main__":
    main()
