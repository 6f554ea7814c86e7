"""Layer 5, beside run, the regression gate: ``compare`` (a run against a stored baseline) and
``history`` (a store of runs, its change points and trends), read from results files only.

May import: measure, records, the contract, errors. Never run (its sibling), the library, the
registry or a technique, reports or cli.
"""
