"""Where the history goes: :class:`HistoryStore` over SQLite (the default, stdlib ``sqlite3``) or
a server database (``--store postgresql://...``, through SQLAlchemy Core when it is installed:
``pip install 'gpubench[history-server]'``). Both run the statements of
:mod:`gpubench.gate.history.schema`.

The store is ``--store``, else ``$GPUBENCH_HISTORY``, else
``$XDG_DATA_HOME/gpubench/history.sqlite`` (``~/.local/share/gpubench/history.sqlite``). A value
with ``://`` is a database URL (``sqlite:///path`` goes through SQLAlchemy too).

Concurrent writers (two CI jobs on one file) are safe: SQLite in WAL mode, a busy timeout, and one
transaction per run (``BEGIN IMMEDIATE``: the writer takes the lock before it reads). A file that
is not an SQLite database, or a database with tables of its own and no ``gpubench_meta``, is
refused (BadInput, exit 2) and never written to.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.gate.history import schema
from gpubench.gate.history.rows import ResultRow
from gpubench.records import stats

ENV_VAR = "GPUBENCH_HISTORY"
BUSY_TIMEOUT_S = 60.0
SQLITE_HEADER = b"SQLite format 3\x00"
# The branch a history's level is read from when none is named: the first of these the store holds,
# else the branch with the most runs. Runs that recorded no branch count as this branch's.
DEFAULT_BRANCHES = ("main", "master")
SERVER_EXTRA = (
    "pip install 'gpubench[history-server]' (SQLAlchemy 2) and the database's driver (psycopg for PostgreSQL)"
)


def default_path() -> Path:
    """``$XDG_DATA_HOME/gpubench/history.sqlite``, ``~/.local/share`` when XDG_DATA_HOME is unset."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "gpubench" / "history.sqlite"


def resolve_store(option: str | None) -> str:
    """The store a command uses: ``--store``, else $GPUBENCH_HISTORY, else :func:`default_path`."""
    return option or os.environ.get(ENV_VAR) or str(default_path())


@dataclass(frozen=True)
class Point:
    """One run's figure of a case's variant: ``median`` with its 95% CI (seconds for the metric
    ``time``; for another metric the recorded figure, exact: CI = the figure). The raw samples are
    ``samples_path``'s case ``case_id``, variant ``variant``."""

    run_id: str
    host: str
    commit: str | None
    branch: str | None
    dirty: bool | None
    started_at: str
    median: float
    ci_low: float | None
    ci_high: float | None
    n: int | None
    samples_path: str
    variant: str
    run_status: str | None


@dataclass(frozen=True)
class HistoryCase:
    """A case of one device model's history, with each variant (name, role) and how many runs
    hold it."""

    case_id: str
    technique: str | None
    params: dict[str, Any]
    gate_metric: str | None
    variants: tuple[tuple[str, str | None], ...]
    runs: int
    last_started_at: str


@dataclass(frozen=True)
class Added:
    """What adding one run did: rows new to the store, rows it held already."""

    run_id: str
    added: int
    present: int


class _Sqlite:
    """sqlite3 on a file: WAL, busy timeout, BEGIN IMMEDIATE transactions."""

    def __init__(self, path: Path, read_only: bool = False):
        self.where = str(path)
        self.path = path
        self.is_sqlite = True
        _check_sqlite_file(path)
        if read_only and not (path.is_file() and path.stat().st_size):
            raise BadInput(
                f"history store {path}: there is none (each `gpubench run` adds its run to the store; "
                f"`gpubench history add RUN_DIR` imports old runs); give another with --store or {ENV_VAR}."
            )
        try:
            if read_only:  # a reader needs no write access, and never creates or changes the file
                self.conn = sqlite3.connect(
                    f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None
                )
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise BadInput(
                f"history store {path}: cannot be opened ({exc}); give a "
                f"{'readable' if read_only else 'writable'} file with --store or {ENV_VAR}."
            ) from None

    def tables(self) -> list[str]:
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]

    def prepare(self) -> None:
        """WAL (readers never block the writer, and a writer waits its turn): set once per file."""
        self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # Switching a new file to WAL needs it to itself, and SQLite answers "database is locked"
        # at once, without waiting on the busy timeout, when another process holds it (two CI jobs
        # starting on one new store): retry until the timeout.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                self.conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Sqlite]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def run(self, sql: str, params: dict[str, Any] | None = None) -> int:
        return self.conn.execute(sql, params or {}).rowcount

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.conn.execute(sql, params or {}).fetchall()]

    def close(self) -> None:
        self.conn.close()


class _Server:
    """A database URL through SQLAlchemy Core: the same SQL, in ``text`` statements."""

    def __init__(self, url: str):
        try:
            import sqlalchemy
        except ImportError:
            raise BadInput(
                f"--store {url}: a database URL needs SQLAlchemy, which is not installed; "
                f"{SERVER_EXTRA}. A file path (the default) needs nothing more."
            ) from None
        self.sa = sqlalchemy
        self.where = url
        try:
            self.engine = sqlalchemy.create_engine(url)
            self.conn = self.engine.connect()
        except Exception as exc:  # noqa: BLE001 - an unknown dialect, a missing driver, a refused connection
            raise BadInput(
                f"--store {url}: cannot connect ({type(exc).__name__}: {exc}); allowed: a file path, "
                f"or a database URL SQLAlchemy can open ({SERVER_EXTRA})."
            ) from None
        self.writing = False
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        if self.is_sqlite:
            self.conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def tables(self) -> list[str]:
        found = list(self.sa.inspect(self.conn).get_table_names())
        if not self.writing and self.conn.in_transaction():
            self.conn.rollback()
        return found

    def prepare(self) -> None:
        if self.conn.in_transaction():
            self.conn.rollback()
        if self.is_sqlite:
            self.conn.exec_driver_sql("PRAGMA journal_mode = WAL")
            self.conn.commit()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Server]:
        if self.conn.in_transaction():
            self.conn.rollback()
        with self.conn.begin():  # commits, or rolls back on an exception
            if self.is_sqlite:  # take the write lock first, as the sqlite3 path does
                self.conn.exec_driver_sql("BEGIN IMMEDIATE")
            self.writing = True
            try:
                yield self
            finally:
                self.writing = False

    def run(self, sql: str, params: dict[str, Any] | None = None) -> int:
        return self.conn.execute(self.sa.text(sql), params or {}).rowcount

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        found = [tuple(r) for r in self.conn.execute(self.sa.text(sql), params or {}).fetchall()]
        if not self.writing and self.conn.in_transaction():  # a read alone ends its own transaction
            self.conn.rollback()
        return found

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


def _check_sqlite_file(path: Path) -> None:
    """A file that exists must be an SQLite database (an empty file is a new one)."""
    if path.is_dir():
        raise BadInput(f"history store {path}: is a directory; give a file path (e.g. {path / 'history.sqlite'}).")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BadInput(f"history store {path}: cannot be read ({exc.strerror or exc}).") from None
    if head and head != SQLITE_HEADER:
        raise BadInput(
            f"history store {path}: not an SQLite database (its first bytes are not the SQLite "
            f"header); it is left as it is. Give another file with --store or {ENV_VAR}."
        )


class HistoryStore:
    """The history: :meth:`add` a run's rows, read a case's :meth:`series`, list :meth:`cases`."""

    def __init__(self, backend: _Sqlite | _Server):
        self.backend = backend
        self.where = backend.where

    # -- opening -----------------------------------------------------------------------------
    def _open(self, read_only: bool = False) -> HistoryStore:
        """Refuse a foreign or corrupt database before writing anything to it, then create the
        tables (in one transaction, so a second process sees all of them or none); ``read_only``:
        only check that it is a store of this schema version."""
        if read_only:
            return self._open_to_read()
        try:
            self._check_tables(self.backend.tables())
            self.backend.prepare()
            with self.backend.transaction():
                self._check_tables(self.backend.tables())
                for statement in schema.CREATE:
                    self.backend.run(statement)
                for key, value in (("schema_version", str(schema.SCHEMA_VERSION)), ("created_by", _writer())):
                    self.backend.run(schema.SET_META, {"key": key, "value": value})
                version = self.backend.rows(schema.GET_VERSION)
        except BadInput:
            self.backend.close()
            raise
        except Exception as exc:  # noqa: BLE001 - sqlite3.DatabaseError ("file is not a database", malformed), a server's error
            self.backend.close()
            raise BadInput(
                f"history store {self.where}: cannot be used ({type(exc).__name__}: {exc}); it may be "
                f"corrupt. It is left as it is; give another store with --store or {ENV_VAR}."
            ) from None
        return self._check_version(version)

    def _open_to_read(self) -> HistoryStore:
        try:
            tables = self.backend.tables()
            self._check_tables(tables)
            version = self.backend.rows(schema.GET_VERSION) if schema.META_TABLE in tables else None
        except BadInput:
            self.backend.close()
            raise
        except Exception as exc:  # noqa: BLE001 - as in _open
            self.backend.close()
            raise BadInput(
                f"history store {self.where}: cannot be read ({type(exc).__name__}: {exc}); it may be "
                f"corrupt, or not readable without write access to its folder (SQLite's WAL needs "
                f"it). It is left as it is."
            ) from None
        if version is None:
            self.backend.close()
            raise BadInput(f"history store {self.where}: holds no runs yet (no {schema.META_TABLE} table).")
        return self._check_version(version)

    def _check_version(self, version: list[tuple[Any, ...]]) -> HistoryStore:
        found = int(version[0][0]) if version and str(version[0][0]).isdigit() else None
        if found != schema.SCHEMA_VERSION:
            self.backend.close()
            raise BadInput(
                f"history store {self.where}: schema version {version[0][0] if version else None!r} in "
                f"{schema.META_TABLE}; this gpubench reads version {schema.SCHEMA_VERSION} (a newer "
                f"gpubench wrote it?). It is left as it is."
            )
        return self

    def _check_tables(self, tables: Sequence[str]) -> None:
        """An SQLite file is ours or new (no tables); a server database may hold other tables,
        but a results table without our meta table is not ours."""
        if schema.META_TABLE in tables:
            return
        if self.backend.is_sqlite and tables:
            raise BadInput(
                f"history store {self.where}: an SQLite database of something else (tables "
                f"{', '.join(sorted(tables)[:5])}; no {schema.META_TABLE}); it is left as it is. "
                f"Give another file with --store or {ENV_VAR}."
            )
        if schema.RESULTS_TABLE in tables:
            raise BadInput(
                f"history store {self.where}: has a {schema.RESULTS_TABLE} table but no "
                f"{schema.META_TABLE}: not a store this gpubench wrote; it is left as it is."
            )

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------
    def add(self, rows: Sequence[ResultRow]) -> list[Added]:
        """Add each run's rows in one transaction per run; rows the store holds already (same run,
        host, device model, case, variant) are left as they are, so adding a run twice adds nothing."""
        by_run: dict[tuple[str, str], list[ResultRow]] = {}
        for row in rows:
            by_run.setdefault((row.run_id, row.host), []).append(row)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        done = []
        for (run_id, host), run_rows in by_run.items():
            key = {"run_id": run_id, "host": host}
            with self.backend.transaction():
                before = self.backend.rows(schema.COUNT_RUN, key)[0][0]
                for row in run_rows:
                    self.backend.run(schema.INSERT, row.to_params(now))
                after = self.backend.rows(schema.COUNT_RUN, key)[0][0]
            done.append(Added(run_id, int(after - before), len(run_rows) - int(after - before)))
        return done

    # -- reading -----------------------------------------------------------------------------
    def device_models(self) -> dict[str, int]:
        """Each device model the store holds, with its number of runs."""
        return {model: int(count) for model, count in self.backend.rows(schema.DEVICE_MODELS)}

    def branches(self, device_model: str) -> dict[str | None, int]:
        """Each branch of ``device_model``'s runs (None: runs that recorded none), with its number of runs."""
        return {
            branch: int(count) for branch, count in self.backend.rows(schema.BRANCHES, {"device_model": device_model})
        }

    def default_branch(self, device_model: str) -> str | None:
        """The branch whose runs make ``device_model``'s level when none is named: main, else
        master, else the branch with the most runs (then by name), unless the runs that recorded
        no branch (a history older than branch recording) outnumber it: then main, whose runs they
        count as. None when no run recorded one."""
        counts = self.branches(device_model)
        held = {branch: n for branch, n in counts.items() if branch}
        for name in DEFAULT_BRANCHES:
            if name in held:
                return name
        if not held:
            return None
        most = min(held, key=lambda branch: (-held[branch], branch))
        return DEFAULT_BRANCHES[0] if counts.get(None, 0) >= held[most] else most

    def counts_unbranched(self, device_model: str, branch: str) -> bool:
        """Whether runs that recorded no branch count as ``branch``'s: the trunk's (main, master)
        or the default branch's (a pull request's runs always name their branch)."""
        return branch in DEFAULT_BRANCHES or branch == self.default_branch(device_model)

    def cases(self, device_model: str) -> list[HistoryCase]:
        """The cases of ``device_model``'s history, by case id. One id can hold rows of several
        params (a param added since, left out of the id at its default, is in the newer rows'
        params only): their runs add up, and the params are the newest run's."""
        grouped: dict[str, dict[str, Any]] = {}
        runs_of: dict[tuple[str, str], int] = {}  # (case id, variant) -> runs, over its params' groups
        for case_id, technique, params, gate, variant, role, runs, last in self.backend.rows(
            schema.CASES, {"device_model": device_model}
        ):
            entry = grouped.setdefault(
                case_id,
                {
                    "case_id": case_id,
                    "technique": technique,
                    "params": json.loads(params or "{}"),
                    "gate_metric": gate,
                    "variants": {},
                    "runs": 0,
                    "last_started_at": "",
                },
            )
            if (last or "") > entry["last_started_at"]:
                entry["params"] = json.loads(params or "{}")
            entry["variants"][variant] = role
            runs_of[case_id, variant] = runs_of.get((case_id, variant), 0) + int(runs)
            entry["runs"] = max(entry["runs"], runs_of[case_id, variant])
            entry["last_started_at"] = max(entry["last_started_at"], last or "")
        return [HistoryCase(**{**e, "variants": tuple(e["variants"].items())}) for e in grouped.values()]

    def series(
        self, device_model: str, case_id: str, variant: str, metric: str = "time", branch: str | None = None
    ) -> list[Point]:
        """The case's figures run by run, in run order (start time, then run id), on one device
        model. ``variant``: a variant's name, or a role (``optimized``, ``baseline``) when no
        variant has that name. ``metric``: ``time`` (the median time, s, with its bootstrap CI) or
        a metric the variant recorded (its gate metric, e.g. ``bytes_reserved``): exact figures.
        ``branch``: that branch's runs only, with the runs that recorded no branch when they count
        as its (:meth:`counts_unbranched`: main, master or the default branch), so a pull
        request's runs never move main's level; None: every run.
        Runs without the figure (a failed variant) are left out."""
        params = {"device_model": device_model, "case_id": case_id, "variant": variant}
        found = self.backend.rows(schema.series(by_role=False), params) or self.backend.rows(
            schema.series(by_role=True), params
        )
        points = []
        for values in found:
            row = dict(zip(schema.POINT_COLUMNS, values))
            if metric == "time":
                median, low, high = row["median_s"], row["ci_low_s"], row["ci_high_s"]
                if isinstance(row["n"], int) and not stats.has_interval(row["n"]):
                    low = high = None  # an older gpubench stored an interval from too few samples
            else:
                value = json.loads(row["metrics_json"] or "{}").get(metric)
                median = low = high = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if median is None:
                continue
            points.append(
                Point(
                    row["run_id"],
                    row["host"],
                    row["git_commit"],
                    row["branch"],
                    None if row["dirty"] is None else bool(row["dirty"]),
                    row["started_at"],
                    float(median),
                    low,
                    high,
                    row["n"],
                    row["results_path"],
                    row["variant"],
                    row["run_status"],
                )
            )
        if branch is None:
            return points
        unbranched_too = any(p.branch is None for p in points) and self.counts_unbranched(device_model, branch)
        return [p for p in points if p.branch == branch or (unbranched_too and p.branch is None)]


def _writer() -> str:
    from gpubench import __version__

    return f"gpubench {__version__}"


def open_store(spec: str | os.PathLike[str] | None = None, *, read_only: bool = False) -> HistoryStore:
    """The store ``spec`` names (a file path or a database URL; None: :func:`resolve_store`),
    created where it does not exist. ``read_only`` (the readers: tables, pages, the history gate):
    never created or written, and no write access needed; an absent store is BadInput. BadInput
    (exit 2) naming it when it cannot be used."""
    text = resolve_store(None if spec is None else str(spec))
    backend = _Server(text) if "://" in text else _Sqlite(Path(text).expanduser(), read_only)
    return HistoryStore(backend)._open(read_only)
