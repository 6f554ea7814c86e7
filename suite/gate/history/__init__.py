"""The history store: every run's results, one row per (run, case, variant), kept across runs
so a case's trend and its change points can be read back (issue 27).

- :mod:`gpubench.gate.history.schema`: the SQL, in one place, shared by both back ends;
- :mod:`gpubench.gate.history.rows`: a run (a results file, or pytest-benchmark JSON) -> typed rows;
- :mod:`gpubench.gate.history.store`: :class:`HistoryStore` (SQLite by default, a server database
  through SQLAlchemy), where the rows go and how they are read back (:meth:`HistoryStore.series`).
"""

from __future__ import annotations

from gpubench.gate.history.rows import ResultRow, rows_of_file, rows_of_run
from gpubench.gate.history.store import Added, HistoryCase, HistoryStore, Point, default_path, open_store, resolve_store

__all__ = [
    "Added",
    "HistoryCase",
    "HistoryStore",
    "Point",
    "ResultRow",
    "default_path",
    "open_store",
    "resolve_store",
    "rows_of_file",
    "rows_of_run",
]
