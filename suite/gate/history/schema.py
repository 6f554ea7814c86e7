"""The history store's SQL, the one place it is written: SQLite (sqlite3) and a server database
(SQLAlchemy Core's ``text``) run the same statements, with ``:name`` parameters both accept.

Version 1: ``gpubench_meta`` (key, value: ``schema_version`` and the writer) and
``gpubench_results``, one row per (run, host, device model, case, variant). A run is known by its
directory name and its host, so two CI machines that start the same scenario in the same second
keep two runs. A later version migrates from ``gpubench_meta.schema_version``.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
META_TABLE = "gpubench_meta"
RESULTS_TABLE = "gpubench_results"
TABLES = (META_TABLE, RESULTS_TABLE)

# (column, SQL type): the row's fields in order (gpubench.gate.history.rows.ResultRow has the same names).
# Types both SQLite and PostgreSQL take; dirty is 0/1 (NULL: unknown).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "TEXT NOT NULL"),
    ("host", "TEXT NOT NULL"),
    ("device_model", "TEXT NOT NULL"),
    ("case_id", "TEXT NOT NULL"),
    ("variant", "TEXT NOT NULL"),
    ("started_at", "TEXT NOT NULL"),  # ISO 8601, UTC: run order
    ("source", "TEXT NOT NULL"),  # gpubench or pytest-benchmark
    ("run_status", "TEXT"),  # complete, interrupted, aborted, crashed (as results.json says)
    ("git_commit", "TEXT"),
    ("branch", "TEXT"),
    ("dirty", "INTEGER"),
    ("driver_version", "TEXT"),
    ("torch_version", "TEXT"),
    ("triton_version", "TEXT"),
    ("gpubench_version", "TEXT"),
    ("scenario", "TEXT"),
    ("technique", "TEXT"),
    ("params_json", "TEXT"),
    ("role", "TEXT"),
    ("case_status", "TEXT"),
    ("variant_status", "TEXT"),
    ("median_s", "DOUBLE PRECISION"),
    ("ci_low_s", "DOUBLE PRECISION"),
    ("ci_high_s", "DOUBLE PRECISION"),
    ("iqr_s", "DOUBLE PRECISION"),
    ("n", "INTEGER"),
    ("gate_metric", "TEXT"),
    ("gate_value", "DOUBLE PRECISION"),
    ("metrics_json", "TEXT"),  # the variant's scalar metrics
    ("results_path", "TEXT"),  # the raw samples: this file's cases[case_id].variants[variant].samples_s
    ("added_at", "TEXT NOT NULL"),
)
KEY = ("run_id", "host", "device_model", "case_id", "variant")
NAMES = tuple(name for name, _ in COLUMNS)

CREATE = (
    f"CREATE TABLE IF NOT EXISTS {META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {RESULTS_TABLE} ("
    + ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
    + f", PRIMARY KEY ({', '.join(KEY)}))",
    f"CREATE INDEX IF NOT EXISTS gpubench_results_series ON {RESULTS_TABLE} "
    "(device_model, case_id, variant, started_at)",
)
SET_META = f"INSERT INTO {META_TABLE} (key, value) VALUES (:key, :value) ON CONFLICT DO NOTHING"
GET_VERSION = f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'"

# Idempotent: a row already there (same run, host, device model, case, variant) is left as it is.
INSERT = (
    f"INSERT INTO {RESULTS_TABLE} ({', '.join(NAMES)}) VALUES ({', '.join(':' + n for n in NAMES)}) "
    "ON CONFLICT DO NOTHING"
)
COUNT_RUN = f"SELECT COUNT(*) FROM {RESULTS_TABLE} WHERE run_id = :run_id AND host = :host"

POINT_COLUMNS = (
    "run_id",
    "host",
    "git_commit",
    "branch",
    "dirty",
    "started_at",
    "run_status",
    "variant_status",
    "median_s",
    "ci_low_s",
    "ci_high_s",
    "n",
    "metrics_json",
    "results_path",
    "variant",
    "role",
)
SERIES = (
    f"SELECT {', '.join(POINT_COLUMNS)} FROM {RESULTS_TABLE} "
    "WHERE device_model = :device_model AND case_id = :case_id AND {match} = :variant "
    "ORDER BY started_at, run_id, host"
)
CASES = (
    f"SELECT case_id, technique, params_json, gate_metric, variant, role, COUNT(*), MAX(started_at) "
    f"FROM {RESULTS_TABLE} WHERE device_model = :device_model "
    "GROUP BY case_id, technique, params_json, gate_metric, variant, role ORDER BY case_id, variant"
)
BRANCHES = (
    f"SELECT branch, COUNT(DISTINCT run_id) FROM {RESULTS_TABLE} WHERE device_model = :device_model "
    "GROUP BY branch ORDER BY branch"
)
DEVICE_MODELS = (
    f"SELECT device_model, COUNT(DISTINCT run_id) FROM {RESULTS_TABLE} GROUP BY device_model ORDER BY device_model"
)


def series(by_role: bool) -> str:
    """The series query matching the variant by its name, or by its role."""
    return SERIES.format(match="role" if by_role else "variant")
