"""Ansible callback: every task result and the recap, as JSON, for tests and benchmarks.

ansible-core 2.19 ships no JSON callback (it moved to ansible.posix, and Galaxy is out of reach),
so the tests read this instead of scraping the text recap. Enable it with
``ANSIBLE_CALLBACK_PLUGINS=tests/testbed/callback_plugins ANSIBLE_CALLBACKS_ENABLED=ct200_report``
and name the output file in ``CT200_ANSIBLE_REPORT``.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: ct200_report
type: aggregate
short_description: write task results and the recap as JSON to $CT200_ANSIBLE_REPORT
description:
  - Records, per task and host, the status (ok, changed, failed, skipped, unreachable) and the
    time since the task started, and per host the recap counters.
requirements:
  - enable in callbacks_enabled; set CT200_ANSIBLE_REPORT to the output path
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ct200_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.results: list[dict[str, object]] = []
        self.tasks: list[dict[str, object]] = []
        self.started = time.monotonic()
        self._task_started = self.started

    def v2_playbook_on_task_start(self, task, is_conditional):  # type: ignore[no-untyped-def]
        self._task_started = time.monotonic()
        self.tasks.append({"name": task.get_name(), "started": self._task_started - self.started})

    def _add(self, result, status: str) -> None:  # type: ignore[no-untyped-def]
        res = result._result
        if status == "ok" and res.get("changed"):
            status = "changed"
        self.results.append(
            {
                "task": result._task.get_name(),
                "host": result._host.get_name(),
                "status": status,
                "seconds": round(time.monotonic() - self._task_started, 3),
                "msg": str(res.get("msg", ""))[:500],
                # A loop's items each ran the module: the benchmarks count them.
                "items": len(res["results"]) if isinstance(res.get("results"), list) else 1,
                "action": result._task.action,
            }
        )

    def v2_runner_on_ok(self, result):  # type: ignore[no-untyped-def]
        self._add(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):  # type: ignore[no-untyped-def]
        self._add(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):  # type: ignore[no-untyped-def]
        self._add(result, "skipped")

    def v2_runner_on_unreachable(self, result):  # type: ignore[no-untyped-def]
        self._add(result, "unreachable")

    def v2_playbook_on_stats(self, stats):  # type: ignore[no-untyped-def]
        path = os.environ.get("CT200_ANSIBLE_REPORT")
        if not path:
            return
        recap = {host: stats.summarize(host) for host in sorted(stats.processed)}
        report = {
            "seconds": round(time.monotonic() - self.started, 3),
            "stats": recap,
            "tasks": self.tasks,
            "results": self.results,
        }
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
