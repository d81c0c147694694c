"""The doctor: probes read the machine into facts, checks judge them, reports render.

probes/ (read, never judge) -> ct200_tools.facts (plain data, JSON round-trip, shared with the
stager) -> checks/ (pure, one module per id prefix) -> report.py (text, JSON, textfile); gate.py
and scope.py narrow a run to one server, fleet.py judges many hosts' reports, docs.py writes
docs/checks.md."""
