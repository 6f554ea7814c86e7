"""Layer 5, running a scenario: the scenario file, the supervisor and its executors (worker
processes, in-process, Ray), the worker, the per-case runner, budgets and estimates, stopping, the
run's closing record.

May import: the technique registry and its catalogue (never a technique package by name, nor
baselines/ or optimizations/), the library, measure, records, the contract, errors. Never gate
(its sibling), reports or cli.
"""
