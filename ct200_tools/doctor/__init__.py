"""The doctor: probes read the machine into facts, checks judge them, reports render.

probes/ (read, never judge) -> facts.py (plain data, JSON round-trip) -> checks/ (pure, one
module per id prefix) -> report.py (text, JSON, textfile); gate.py and scope.py narrow a run
to one server, fleet.py judges many hosts' reports, docs.py writes docs/checks.md."""
