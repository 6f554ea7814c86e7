"""The history store (issue 27.1): every run's (case, variant) rows kept across runs, added by
`gpubench run` and `gpubench history add`, safe with two writers, never written over a file that is
not its own. Synthetic runs written as results files; no scenario runs here."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.cli.history import append_run
from gpubench.errors import BadInput
from gpubench.gate import history
from gpubench.gate.history import schema
from gpubench.records.results import SCHEMA_VERSION, load_run


def _variant(role, median, gate=None):
    samples = [median * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]
    return {
        "role": role,
        "status": "ok",
        "samples_s": samples,
        "stats": {"median": median, "ci_low": median * 0.99, "ci_high": median * 1.01, "n": 5, "iqr": median * 0.02},
        "metrics": {
            "tokens_per_s": 1.0 / median,
            **({"bytes_reserved": gate} if gate else {}),
            "nested": {"dropped": 1},
        },
    }


def write_run(
    root: Path,
    run_id: str,
    started_at: str,
    commit: str,
    optimized_s: float = 1e-3,
    *,
    status="complete",
    host="ci-1",
    device="NVIDIA H100 80GB HBM3",
    n_cases=2,
    branch="main",
) -> Path:
    """A run directory with a results.json as `gpubench run` writes it (two cases, two variants each)."""
    cases = [
        {
            "id": f"t n={i}",
            "technique": "t",
            "params": {"n": i, "dtype": "bf16"},
            "seed": 0,
            "policy": {},
            "status": "passed",
            "gate_metric": "",
            "variants": {"loop": _variant("baseline", 2e-3), "fused": _variant("optimized", optimized_s * (i + 1))},
        }
        for i in range(n_cases)
    ]
    cases.append(
        {
            "id": "kv bytes",
            "technique": "kv_cache",
            "params": {},
            "seed": 0,
            "policy": {},
            "status": "passed",
            "gate_metric": "bytes_reserved",
            "variants": {"paged": _variant("optimized", 1e-4, gate=4096.0)},
        }
    )
    doc = {
        "kind": "gpubench.results",
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "device": "cuda:0",
        "device_label": device,
        "scenario": {"name": "gpu-quick", "entries": []},
        "status": status,
        "started_at": started_at,
        "env": {
            "host": host,
            "torch": "2.13.0",
            "triton": "3.5.0",
            "gpubench_version": "0.1.0",
            "git": {"commit": commit, "branch": branch, "dirty": False},
            "gpu": {"name": device, "driver_version": "580.65"},
        },
        "cases": cases,
    }
    path = root / run_id
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps(doc))
    return path


def _add(paths, store) -> list[history.Added]:
    with history.open_store(store) as opened:
        return [a for p in paths for a in opened.add(history.rows_of_file(p))]


def test_a_run_becomes_one_row_per_case_and_variant_with_where_it_came_from(tmp_path):
    run = write_run(tmp_path, "20261204-100000-gpu-quick", "2026-12-04T10:00:00+00:00", "abc123")
    store = tmp_path / "h.sqlite"
    assert [(a.added, a.present) for a in _add([run], store)] == [(5, 0)]
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    rows = {(r["case_id"], r["variant"]): dict(r) for r in db.execute("SELECT * FROM gpubench_results")}
    fused = rows[("t n=1", "fused")]
    assert (
        fused["git_commit"],
        fused["branch"],
        fused["dirty"],
        fused["device_model"],
        fused["driver_version"],
        fused["torch_version"],
        fused["triton_version"],
        fused["scenario"],
        fused["technique"],
        fused["role"],
        fused["run_status"],
        fused["variant_status"],
        fused["n"],
    ) == (
        "abc123",
        "main",
        0,
        "NVIDIA H100 80GB HBM3",
        "580.65",
        "2.13.0",
        "3.5.0",
        "gpu-quick",
        "t",
        "optimized",
        "complete",
        "ok",
        5,
    )
    assert json.loads(fused["params_json"]) == {"n": 1, "dtype": "bf16"}
    assert fused["median_s"] == pytest.approx(2e-3) and fused["ci_low_s"] < fused["median_s"] < fused["ci_high_s"]
    # the raw samples' location: the results file, whose case and variant keys are the row's
    samples = load_run(fused["results_path"]).cases[1].variants["fused"].samples_s
    assert Path(fused["results_path"]) == (run / "results.json").resolve() and len(samples) == 5
    kv = rows[("kv bytes", "paged")]
    assert (kv["gate_metric"], kv["gate_value"]) == ("bytes_reserved", 4096.0)
    assert "nested" not in json.loads(kv["metrics_json"])  # scalar metrics only
    assert db.execute("SELECT value FROM gpubench_meta WHERE key = 'schema_version'").fetchone()[0] == "1"


def test_adding_the_same_run_twice_adds_nothing(tmp_path):
    run = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    store = tmp_path / "h.sqlite"
    _add([run], store)
    assert [(a.added, a.present) for a in _add([run], store)] == [(0, 5)]
    assert sqlite3.connect(store).execute("SELECT COUNT(*) FROM gpubench_results").fetchone()[0] == 5


def test_two_hosts_with_the_same_run_directory_name_keep_two_runs(tmp_path):
    a = write_run(tmp_path / "a", "20261204-100000-gpu-quick", "2026-12-04T10:00:00+00:00", "abc", host="ci-1")
    b = write_run(tmp_path / "b", "20261204-100000-gpu-quick", "2026-12-04T10:00:00+00:00", "abc", host="ci-2")
    assert [x.added for x in _add([a, b], tmp_path / "h.sqlite")] == [5, 5]


def test_series_reads_a_case_in_run_order_by_name_or_role_and_by_gate_metric(tmp_path):
    store = tmp_path / "h.sqlite"
    runs = [
        write_run(tmp_path, f"r{i}", f"2026-12-0{i}T10:00:00+00:00", f"c{i}", optimized_s=1e-3 * (1 + i / 10))
        for i in (3, 1, 2)
    ]  # added out of order
    runs.append(write_run(tmp_path, "other", "2026-12-04T10:00:00+00:00", "c4", device="NVIDIA A100-SXM4-80GB"))
    _add(runs, store)
    with history.open_store(store) as opened:
        points = opened.series("NVIDIA H100 80GB HBM3", "t n=0", "fused")
        assert [p.commit for p in points] == ["c1", "c2", "c3"]  # run order, one device model
        assert [p.median for p in points] == pytest.approx([1.1e-3, 1.2e-3, 1.3e-3])
        assert all(p.ci_low < p.median < p.ci_high and p.n == 5 and p.variant == "fused" for p in points)
        assert opened.series("NVIDIA H100 80GB HBM3", "t n=0", "optimized") == points  # by role
        kv = opened.series("NVIDIA H100 80GB HBM3", "kv bytes", "paged", metric="bytes_reserved")
        assert [(p.median, p.ci_low, p.ci_high) for p in kv] == [(4096.0, 4096.0, 4096.0)] * 3
        cases = {c.case_id: c for c in opened.cases("NVIDIA H100 80GB HBM3")}
        assert set(cases) == {"t n=0", "t n=1", "kv bytes"}
        assert cases["t n=1"].variants == (("fused", "optimized"), ("loop", "baseline"))
        assert cases["t n=1"].runs == 3 and cases["t n=1"].params == {"n": 1, "dtype": "bf16"}
        assert cases["kv bytes"].gate_metric == "bytes_reserved"
        assert opened.device_models() == {"NVIDIA A100-SXM4-80GB": 1, "NVIDIA H100 80GB HBM3": 3}


def _append_runs(args):
    store, root, start, count = args
    for i in range(start, start + count):
        run = write_run(Path(root), f"run-{i:03d}", f"2026-12-04T10:{i % 60:02d}:00+00:00", f"c{i}")
        with history.open_store(store) as opened:
            opened.add(history.rows_of_file(run))


@pytest.mark.e2e  # two processes
def test_two_processes_appending_at_once_lose_no_row(tmp_path):
    store = tmp_path / "h.sqlite"
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:  # both start on a store that does not exist yet
        pool.map(_append_runs, [(str(store), str(tmp_path / "a"), 0, 15), (str(store), str(tmp_path / "b"), 15, 15)])
    db = sqlite3.connect(store)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT run_id) FROM gpubench_results").fetchone() == (30 * 5, 30)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("content", [b"not a database at all\n" * 10, b"SQLite format 3\x00" + b"\x07" * 200])
def test_a_corrupt_store_is_refused_with_exit_2_and_left_as_it_is(tmp_path, content):
    store = tmp_path / "h.sqlite"
    store.write_bytes(content)
    run = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    result = CliRunner().invoke(main, ["history", "add", str(run), "--store", str(store)])
    assert result.exit_code == 2 and str(store) in result.output and "Traceback" not in result.output
    assert store.read_bytes() == content


def test_a_foreign_sqlite_file_is_refused_and_never_written(tmp_path):
    store = tmp_path / "app.db"
    db = sqlite3.connect(store)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    before = store.read_bytes()
    with pytest.raises(BadInput, match=r"app\.db: an SQLite database of something else \(tables users"):
        history.open_store(store)
    assert store.read_bytes() == before and not Path(str(store) + "-wal").exists()


def test_a_store_of_a_newer_schema_is_refused(tmp_path):
    store = tmp_path / "h.sqlite"
    history.open_store(store).close()
    db = sqlite3.connect(store)
    db.execute("UPDATE gpubench_meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(BadInput, match="schema version '99'"):
        history.open_store(store)


def test_the_store_is_the_option_else_the_environment_else_xdg_data_home(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUBENCH_HISTORY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert history.default_path() == tmp_path / "xdg" / "gpubench" / "history.sqlite"
    assert history.resolve_store(None) == str(tmp_path / "xdg" / "gpubench" / "history.sqlite")
    monkeypatch.delenv("XDG_DATA_HOME")
    assert history.default_path() == Path.home() / ".local" / "share" / "gpubench" / "history.sqlite"
    monkeypatch.setenv("GPUBENCH_HISTORY", str(tmp_path / "env.sqlite"))
    assert history.resolve_store(None) == str(tmp_path / "env.sqlite")
    assert history.resolve_store(str(tmp_path / "opt.sqlite")) == str(tmp_path / "opt.sqlite")


def test_history_add_imports_runs_and_pytest_benchmark_json_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBENCH_HISTORY", str(tmp_path / "env.sqlite"))
    run = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    bench = tmp_path / "0001_bench.json"
    bench.write_text(
        json.dumps(
            {
                "machine_info": {"node": "dev-box", "cpu": {"brand_raw": "AMD EPYC"}},
                "commit_info": {"id": "def456", "branch": "feature", "dirty": True},
                "datetime": "2026-12-04T11:00:00.123456",
                "benchmarks": [
                    {
                        "group": "g",
                        "name": "test_x",
                        "fullname": "bench.py::test_x",
                        "params": {"k": 2},
                        "stats": {"median": 0.002, "rounds": 4, "data": [0.001, 0.002, 0.002, 0.003]},
                    }
                ],
            }
        )
    )
    first = CliRunner().invoke(main, ["history", "add", str(run), str(bench)])
    assert first.exit_code == 0, first.output
    assert "history store: " + str(tmp_path / "env.sqlite") in first.output
    assert "run r1: 5 rows added" in first.output and "run 0001_bench-" in first.output
    assert ": 1 row added" in first.output
    again = CliRunner().invoke(main, ["history", "add", str(run), str(bench)])
    assert "0 rows added, 5 already there" in again.output and "0 rows added, 1 already there" in again.output
    with history.open_store(tmp_path / "env.sqlite") as opened:
        (point,) = opened.series("CPU: AMD EPYC", "bench.py::test_x", "benchmark")
    assert (point.commit, point.branch, point.dirty, point.host, point.started_at, point.median, point.n) == (
        "def456",
        "feature",
        True,
        "dev-box",
        "2026-12-04T11:00:00+00:00",
        0.002,
        4,
    )


def test_history_add_refuses_a_file_that_is_not_a_run_before_writing(tmp_path):
    good = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    store = tmp_path / "h.sqlite"
    result = CliRunner().invoke(main, ["history", "add", str(good), str(bad), "--store", str(store)])
    assert result.exit_code == 2 and "notes.json" in result.output and not store.exists()


def test_a_run_that_did_not_complete_is_added_with_its_status(tmp_path):
    run_dir = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc", status="interrupted")
    line = append_run(load_run(run_dir), run_dir, str(tmp_path / "h.sqlite"))
    assert line == f"history: 5 rows added to {tmp_path / 'h.sqlite'}"
    with history.open_store(tmp_path / "h.sqlite") as opened:
        assert {p.run_status for p in opened.series("NVIDIA H100 80GB HBM3", "t n=0", "fused")} == {"interrupted"}


def test_a_store_that_cannot_be_written_costs_the_run_a_warning_not_the_run(tmp_path):
    run_dir = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    store = tmp_path / "h.sqlite"
    store.write_text("a text file, not a store")
    line = append_run(load_run(run_dir), run_dir, str(store))
    assert line.startswith(f"warning: the run was not added to the history store {store} (")
    assert "not an SQLite database" in line and f"gpubench history add {run_dir}" in line
    assert store.read_text() == "a text file, not a store" and (run_dir / "results.json").exists()


def test_a_database_url_without_sqlalchemy_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sqlalchemy(name, *args, **kwargs):
        if name == "sqlalchemy" or name.startswith("sqlalchemy."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sqlalchemy)
    result = CliRunner().invoke(main, ["history", "add", "--store", "postgresql://ci@db/bench", "nothing"])
    assert result.exit_code == 2  # the path is checked first: a missing run
    with pytest.raises(BadInput, match=r"needs SQLAlchemy.*gpubench\[history-server\]"):
        history.open_store("postgresql://ci@db/bench")


def test_a_database_url_goes_through_sqlalchemy_with_the_same_sql(tmp_path):
    pytest.importorskip("sqlalchemy")
    runs = [write_run(tmp_path, f"r{i}", f"2026-12-0{i}T10:00:00+00:00", f"c{i}") for i in (1, 2)]
    url = f"sqlite:///{tmp_path / 'sa.sqlite'}"
    with history.open_store(url) as opened:
        assert type(opened.backend).__name__ == "_Server"
        assert [a.added for a in opened.add([r for run in runs for r in history.rows_of_file(run)])] == [5, 5]
        assert [a.added for a in opened.add(history.rows_of_file(runs[0]))] == [0]
        assert [p.commit for p in opened.series("NVIDIA H100 80GB HBM3", "t n=1", "optimized")] == ["c1", "c2"]
    with history.open_store(tmp_path / "sa.sqlite") as plain:  # the file is the sqlite3 path's too
        assert len(plain.series("NVIDIA H100 80GB HBM3", "t n=1", "fused")) == 2
    foreign = tmp_path / "app.db"
    sqlite3.connect(foreign).execute("CREATE TABLE users (name TEXT)")
    with pytest.raises(BadInput, match="something else"):
        history.open_store(f"sqlite:///{foreign}")


SERVER_URL = os.environ.get("GPUBENCH_TEST_SERVER_STORE")  # e.g. postgresql+psycopg://user@/db?host=/tmp


@pytest.mark.skipif(
    not SERVER_URL,
    reason="set GPUBENCH_TEST_SERVER_STORE to a database URL gpubench may fill "
    "(an empty PostgreSQL database) to test the store against a real server",
)
def test_a_real_database_server_stores_runs_once_and_serves_them_read_only(tmp_path):
    """The server path against a real server (PostgreSQL 15 and psycopg 3 when last run by hand; CI
    has none): rows added once however often or concurrently a run is added, series in run order,
    and the read-only open the readers use."""
    pytest.importorskip("sqlalchemy")
    tag = f"t{os.getpid()}"
    runs = [write_run(tmp_path, f"{tag}-r{i}", f"2026-12-0{i}T10:00:00+00:00", f"{tag}c{i}") for i in (1, 2, 3)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:  # two writers, overlapping runs
        pool.map(_add_files, [(SERVER_URL, [str(r) for r in runs[:2]]), (SERVER_URL, [str(r) for r in runs[1:]])])
    with history.open_store(SERVER_URL) as opened:
        assert [a.added for a in opened.add(history.rows_of_file(runs[0]))] == [0]
    with history.open_store(SERVER_URL, read_only=True) as opened:
        points = [p for p in opened.series("NVIDIA H100 80GB HBM3", "t n=1", "fused") if p.run_id.startswith(tag)]
        assert [p.commit for p in points] == [f"{tag}c1", f"{tag}c2", f"{tag}c3"]


def _add_files(args):
    url, paths = args
    with history.open_store(url) as opened:
        for path in paths:
            opened.add(history.rows_of_file(path))


def test_the_schema_names_every_field_of_a_row():
    assert schema.NAMES == tuple(f for f in history.ResultRow.__dataclass_fields__)


@pytest.mark.e2e  # a (toy) scenario run
def test_gpubench_run_adds_its_run_unless_no_history(toys, write_scenario, tmp_path):
    """In this process (--isolation none, a toy case): the run's rows land in --store; --no-history
    adds nothing; the report line stays the last."""
    path = write_scenario("name: ok\nentries:\n  - technique: toy_kernel\n")
    store = tmp_path / "runs.sqlite"
    args = ["run", "--scenario", str(path), "--out", str(tmp_path / "runs"), "--no-calibrate", "--isolation", "none"]
    result = CliRunner().invoke(main, [*args, "--store", str(store)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    added = re.search(rf"history: (\d+) rows added to {re.escape(str(store))}\n", result.output)
    assert (
        added and int(added[1]) == sqlite3.connect(store).execute("SELECT COUNT(*) FROM gpubench_results").fetchone()[0]
    )
    assert result.output.strip().splitlines()[-1].startswith("report: ")
    skipped = CliRunner().invoke(main, [*args, "--store", str(store), "--no-history"], catch_exceptions=False)
    assert skipped.exit_code == 0 and "history:" not in skipped.output
    with history.open_store(store) as opened:
        (model,) = opened.device_models()
        (case,) = opened.cases(model)
        points = opened.series(model, case.case_id, "optimized")
    assert len(points) == 1 and points[0].run_status == "complete" and points[0].median > 0
    assert Path(points[0].samples_path).parent.parent == tmp_path / "runs"


@pytest.mark.parametrize("where", ["before add", "after add"])
def test_history_add_writes_to_the_store_given_before_or_after_add(tmp_path, monkeypatch, where):
    """`gpubench history --store X add RUN` and `gpubench history add --store X RUN` both write X
    (the group's option once went unread, and the run landed in the default store)."""
    monkeypatch.setenv("GPUBENCH_HISTORY", str(tmp_path / "default.sqlite"))
    run = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    store = str(tmp_path / "x.sqlite")
    args = (
        ["history", "--store", store, "add", str(run)]
        if where == "before add"
        else ["history", "add", "--store", store, str(run)]
    )
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"history store: {store}" in result.output
    assert sqlite3.connect(store).execute("SELECT COUNT(*) FROM gpubench_results").fetchone()[0] == 5
    assert not (tmp_path / "default.sqlite").exists()


def test_history_add_with_two_different_stores_is_bad_input(tmp_path):
    run = write_run(tmp_path, "r1", "2026-12-04T10:00:00+00:00", "abc")
    result = CliRunner().invoke(
        main, ["history", "--store", str(tmp_path / "a.sqlite"), "add", "--store", str(tmp_path / "b.sqlite"), str(run)]
    )
    assert result.exit_code == 2 and "two values of --store given" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "a.sqlite").exists() and not (tmp_path / "b.sqlite").exists()


def test_an_empty_gpubench_history_variable_means_the_default_store(tmp_path, monkeypatch):
    """The GPU workflow sets GPUBENCH_HISTORY from a repository variable that is usually unset (an
    empty string): that is the default store, never a file named ''."""
    monkeypatch.setenv("GPUBENCH_HISTORY", "")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert history.resolve_store(None) == str(tmp_path / "xdg" / "gpubench" / "history.sqlite")


def test_readers_open_the_store_read_only_and_never_create_one(tmp_path):
    """The report's sparklines, the history table and page and the history gate only read: they
    open the file read-only (so a shared store they may not write still serves them, and they
    never take the writers' lock), and an absent store is a one-paragraph BadInput, never a new
    file."""
    from gpubench.errors import BadInput

    missing = tmp_path / "none.sqlite"
    with pytest.raises(BadInput, match="there is none"):
        history.open_store(missing, read_only=True)
    assert not missing.exists()

    store = tmp_path / "h.sqlite"
    _add([write_run(tmp_path, "r1", "2026-12-01T10:00:00+00:00", "c1")], store)
    before = store.read_bytes()
    with history.open_store(store, read_only=True) as opened:
        assert opened.device_models() == {"NVIDIA H100 80GB HBM3": 1}
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            opened.backend.run("CREATE TABLE scratch (x INTEGER)")
    assert store.read_bytes() == before


def test_pytest_benchmark_files_of_the_same_name_from_two_commits_are_two_runs(tmp_path):
    """CI writes every commit's results to one --benchmark-json out.json: the second commit's file
    must be stored beside the first's (it was '0 rows added, 2 already there': the run id was the
    file's name), and the same file added again still adds nothing."""
    store = tmp_path / "h.sqlite"

    def bench(commit: str, when: str, median: float) -> Path:
        path = tmp_path / commit / "out.json"
        path.parent.mkdir()
        path.write_text(
            json.dumps(
                {
                    "machine_info": {"node": "ci-runner", "cpu": {"brand_raw": "AMD EPYC"}},
                    "commit_info": {"id": commit, "branch": "main", "dirty": False},
                    "datetime": when,
                    "benchmarks": [
                        {
                            "group": "g",
                            "name": "test_x",
                            "fullname": "bench.py::test_x",
                            "stats": {"median": median, "rounds": 3, "data": [median] * 3},
                        }
                    ],
                }
            )
        )
        return path

    first, second = bench("aaa111", "2026-12-04T10:00:00", 0.001), bench("bbb222", "2026-12-05T10:00:00", 0.002)
    for path in (first, second):
        result = CliRunner().invoke(main, ["history", "add", str(path), "--store", str(store)])
        assert result.exit_code == 0 and ": 1 row added" in result.output, result.output
    again = CliRunner().invoke(main, ["history", "add", str(second), "--store", str(store)])
    assert "0 rows added, 1 already there" in again.output
    with history.open_store(store) as opened:
        points = opened.series("CPU: AMD EPYC", "bench.py::test_x", "benchmark")
    assert [(p.commit, p.median) for p in points] == [("aaa111", 0.001), ("bbb222", 0.002)]
