"""ct200-bench: benchmark OpenAI-compatible inference servers, with metrics as the engines' own
benchmark clients define them, append-only results with provenance, and a report.

plan (schema and validation; workload: a workload's keys, datasets: the prompt files read) ->
runner (the sweep; feed: each point's fresh prompts, made by prompts) over client (the streaming
load generator) -> metrics -> results (the append-only store, resume) beside provenance; watch
reads GPU telemetry (telemetry) and speculative acceptance (specdec) around each point; managed
switches to each serving set and asks the doctor first (managed_run: the managed mode);
aggregate, report and compare read the store back. cli/bench.py only parses and prints.
"""
