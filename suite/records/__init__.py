"""Layer 1, with the base's contract and checks: what a run writes and every later reader reads.
The results directory and its typed records, the declarations a report needs instead of technique
code, the energy figure's record, a scenario's policy, the statistics over timed samples, published
claims and their verdicts, pytest-benchmark's JSON, atomic writes, notices.

May import: gpubench.errors, gpubench.contract, gpubench.checks and one another. Never measure, the
library, a technique or the registry, run, gate, reports or cli, directly or lazily: a record, and
through it a report, never runs measuring or technique code.
"""
