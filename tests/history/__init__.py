"""Histories of task runs, recorded from outside the daemons and checked (issue 17).

`probe.py` is the task command that records each run; `checker.py` checks a history
against the one-owner invariants; `scenario.py` drives real daemons and gathers the
history. `benchmarks/ownership_bench.py` imports the same modules.
"""
