"""The history gate's level rules (issue 34.4-34.6), each by a history that tells the right rule
from a planted wrong one: a level starts at the *last* change point (two steps); a run is judged by
the runs *before* it only (a judged run already in the store, later runs stored after it);
"regressed" means above the level's 95% CI high end x (1 + threshold), not above its median x
(1 + threshold); `--since RUN` includes that run (at the step's own run); a regression names its
suspect commits; and `--since` lists the change points the levels start at. Synthetic histories of
real CPU noise (tests/data/cpu_noise.json, as in test_changepoints)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_changepoints import _current_run, _row, history_values
from test_history_branches import add_runs

from gpubench.cli import main
from gpubench.gate.history import judge, open_store
from gpubench.records import stats

CASE = "t[model=x,n=1]"


def run_file(tmp_path, figure: float, *, run: int | None = None) -> Path:
    """A run's results.json with the optimized variant at ``figure``: the new run "now" (after every
    stored run, commit pr1), or stored run ``run`` itself (its id, host, start time and commit)."""
    path = _current_run(Path(tempfile.mkdtemp(dir=tmp_path)), figure)
    if run is not None:
        doc = json.loads((path / "results.json").read_text())
        doc.update(run_id=f"run{run:02d}", started_at=f"2026-12-01T00:{run:02d}:00+00:00")
        doc["env"]["git"]["commit"] = f"c{run:02d}"
        (path / "results.json").write_text(json.dumps(doc))
    return path


def compare(tmp_path, store, path, *extra):
    out = CliRunner().invoke(main, ["compare", "--history", "--store", str(store), "--json", *extra, str(path)])
    assert out.exit_code in (0, 1), out.output
    return out.exit_code, json.loads(out.output)


def two_steps(runs=18, first=5, second=11, step=0.15) -> np.ndarray:
    values = history_values(31, runs, step_at=first, step=step)
    values[second:] *= 1 + step
    return values


# -- the level starts at the last change point ----------------------------------------------------


@pytest.mark.parametrize("factor,verdict", [(1.0, "passed"), (1.15, "regressed")])
def test_with_two_steps_the_level_is_the_runs_since_the_second(tmp_path, factor, verdict):
    """Steps of +15% at runs 5 and 11 of 18: the level is runs 11-17 (7 runs, since c11). From the
    first step it would be 13 runs whose median sits between the two levels."""
    store, values = tmp_path / "h.sqlite", two_steps()
    add_runs(store, values)
    level = values[11:]
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(level)) * factor))
    (case,) = doc["cases"]
    assert (case["verdict"], case["level_runs"], case["since_commit"]) == (verdict, 7, "c11")
    assert case["level_median"] == pytest.approx(float(np.median(level)))
    assert code == (1 if verdict == "regressed" else 0)


@pytest.mark.parametrize("stored", [23, 24])
def test_after_a_regression_later_reverted_the_level_is_the_runs_since_the_revert(tmp_path, stored):
    """Runs 9-16 20% slower, then back: the level is the runs since the revert (c16), and a run
    15% slower than it fails. Before, with 24 runs stored both changes were lost, the level was all
    24 runs (their CI reaching into the slow ones) and the run passed."""
    from test_changepoints import up_then_down

    store, values = tmp_path / "h.sqlite", up_then_down(0, stored)
    add_runs(store, values)
    level = values[16:]
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(level)) * 1.15))
    (case,) = doc["cases"]
    assert (code, case["verdict"], case["level_runs"], case["since_commit"]) == (1, "regressed", stored - 16, "c16")


@pytest.mark.parametrize(
    "history,verdict,runs",
    [
        ([3.0, 1.0, 1.01, 0.99, 1.0], "inconclusive", None),  # 4 runs left in the level: 5 needed
        ([3.0, 1.0, 1.01, 0.99, 1.0, 1.0], "regressed", 5),
    ],
)
def test_a_run_set_aside_is_not_in_the_level(tmp_path, history, verdict, runs):
    """A cold start 3x slower is set aside by change point detection (in no level's median); it is
    left out of the gate's level too. Before, it stayed in: the level's CI reached 3.0 and a run
    50% slower passed."""
    store = tmp_path / "h.sqlite"
    add_runs(store, history)
    code, doc = compare(tmp_path, store, run_file(tmp_path, 1.5))
    (case,) = doc["cases"]
    assert (case["verdict"], case["level_runs"]) == (verdict, len(history) - 1)
    assert code == (1 if verdict == "regressed" else 0)
    if runs:
        assert case["level_ci_high"] < 1.1


# -- a run is judged by the runs before it -----------------------------------------------------------


def test_a_run_already_in_the_store_is_judged_without_itself(tmp_path):
    """Run 12, 20% slower, is stored with its 12 predecessors, then judged: against those 12 only
    (its own figure in the level would widen the CI and move the median)."""
    store, values = tmp_path / "h.sqlite", history_values(8, 12)
    add_runs(store, [*values, float(np.median(values)) * 1.2])
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values)) * 1.2, run=12))
    (case,) = doc["cases"]
    assert (code, case["verdict"], case["level_runs"]) == (1, "regressed", 12)
    assert case["level_median"] == pytest.approx(float(np.median(values)))


def test_an_old_run_reads_as_it_read_when_it_was_new_whatever_is_stored_after_it(tmp_path):
    """A +25% step at run 9 of 16 (index 8): run 9 is judged regressed with 9, 10, ... 16 runs stored
    (before: it failed online and passed once all 16 were stored, against 'level since' run 10's commit)."""
    values = history_values(4, 16, step_at=8, step=0.25)
    store = tmp_path / "h.sqlite"
    add_runs(store, values[:8])
    seen = []
    for n in range(9, 17):
        add_runs(store, values[n - 1 : n], first=n - 1)
        code, doc = compare(tmp_path, store, run_file(tmp_path, float(values[8]), run=8))
        (case,) = doc["cases"]
        seen.append((n, code, case["verdict"], case["level_runs"], case["since_commit"]))
    assert seen == [(n, 1, "regressed", 8, None) for n in range(9, 17)]


def test_judge_reads_the_level_up_to_the_run_s_place_in_the_store_else_its_start_time(tmp_path):
    """A run the store holds: the runs before its place; one it does not: those started before it."""
    with open_store(tmp_path / "h.sqlite") as store:
        store.add([_row(i, "fused", 1.0 + i) for i in range(8)])
        points = store.series("NVIDIA H100", CASE, "fused")
    held = _row(5, "fused", 9.0)
    assert [p.run_id for p in judge.before(points, held)] == ["run00", "run01", "run02", "run03", "run04"]
    new = dataclasses.replace(held, run_id="x", started_at="2026-12-01T00:03:30+00:00")
    assert [p.run_id for p in judge.before(points, new)] == ["run00", "run01", "run02", "run03"]


# -- regressed: above the CI's high end ------------------------------------------------------------


def test_a_figure_between_the_level_s_median_and_its_ci_high_end_times_the_threshold_passes(tmp_path):
    """A noisy level (8% run-to-run): its median x 1.05 is well below its CI high end x 1.05. A run
    between the two passes (a rule against the median would call it regressed); just above the CI
    end, it regresses."""
    rng = np.random.default_rng(3)
    values = history_values(9, 12) * np.exp(rng.normal(0, 0.08, 12))
    store = tmp_path / "h.sqlite"
    add_runs(store, values)
    level = stats.summarize(list(values))
    low, high = level.median * 1.05, level.ci_high * 1.05
    assert high > low * 1.02  # the history tells the two rules apart
    code, doc = compare(tmp_path, store, run_file(tmp_path, (low + high) / 2))
    assert (code, doc["cases"][0]["verdict"], doc["cases"][0]["since_commit"]) == (0, "passed", None)
    code, doc = compare(tmp_path, store, run_file(tmp_path, high * 1.01))
    assert (code, doc["cases"][0]["verdict"]) == (1, "regressed")


# -- --since at the step's own run ------------------------------------------------------------------


@pytest.mark.parametrize("since", ["run11", "c11", "run10"])
def test_since_the_step_s_own_run_lists_that_step(tmp_path, since):
    store, values = tmp_path / "h.sqlite", two_steps()
    add_runs(store, values)
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values[11:]))), "--since", since)
    assert [(r["run_id"], r["kind"]) for r in doc["regressions_since"]] == [("run11", "regression")]
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values[11:]))), "--since", "run12")
    assert doc["regressions_since"] == []


def test_since_a_run_that_did_not_hold_the_case_starts_at_that_run_s_place(tmp_path):
    """--since names a run (another case's only) between the two steps: the second step is listed."""
    store, values = tmp_path / "h.sqlite", two_steps()
    add_runs(store, values)
    other = dataclasses.replace(
        _row(0, "fused", 1.0), case_id="other[n=1]", run_id="tag-run", started_at="2026-12-01T00:08:30+00:00"
    )
    with open_store(store) as opened:
        opened.add([other])
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values[11:]))), "--since", "tag-run")
    assert [r["run_id"] for r in doc["regressions_since"]] == ["run11"]


# -- --since and the level agree; both read the runs before the run judged --------------------------


def test_since_lists_the_change_the_level_starts_at_even_an_improvement(tmp_path):
    """A -15% step at run 6 of 14: the level starts at c06, and --since c03 lists it (as an
    improvement; before, 'regressions since' listed none beside 'level since c06')."""
    store, values = tmp_path / "h.sqlite", history_values(5, 14, step_at=6, step=-0.15)
    add_runs(store, values)
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values[6:]))), "--since", "c03")
    assert doc["cases"][0]["since_commit"] == "c06" and doc["regressions_since"] == []
    assert [(r["commit"], r["kind"]) for r in doc["improvements_since"]] == [("c06", "improvement")]


def test_an_old_run_s_since_listing_ends_where_its_level_does(tmp_path):
    """Steps at runs 5 and 11 of 18 all stored; run 10 judged: its level starts at c05 (runs 5-9),
    and --since run03 lists c05 alone (c11 came after run 10)."""
    store, values = tmp_path / "h.sqlite", two_steps()
    add_runs(store, values)
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(values[10]), run=10), "--since", "run03")
    (case,) = doc["cases"]
    assert (case["verdict"], case["since_commit"], case["level_runs"]) == ("passed", "c05", 5)
    assert [r["commit"] for r in doc["regressions_since"]] == ["c05"]


# -- a regression names its suspect commits --------------------------------------------------------


def test_a_regression_names_the_runs_since_the_last_one_within_the_level(tmp_path):
    """12 runs at a level, then run 12 already 20% slower (one run: not a level yet): the new run,
    20% slower too, regresses, and the suspects are run 12's commit and its own, after c11."""
    store, values = tmp_path / "h.sqlite", history_values(6, 12)
    slow = float(np.median(values)) * 1.2
    add_runs(store, [*values, slow])
    out = CliRunner().invoke(main, ["compare", "--history", "--store", str(store), str(run_file(tmp_path, slow))])
    assert out.exit_code == 1, out.output
    assert "suspect commits, after c11 (run11" in out.output and "c12 (run12" in out.output
    assert "pr1 (now" in out.output
    code, doc = compare(tmp_path, store, run_file(tmp_path, slow))
    (case,) = doc["cases"]
    assert [s["commit"] for s in case["suspects"]] == ["c12", "pr1"] and case["last_within"]["run_id"] == "run11"


def test_a_passing_run_names_no_suspects(tmp_path):
    store, values = tmp_path / "h.sqlite", history_values(6, 12)
    add_runs(store, values)
    code, doc = compare(tmp_path, store, run_file(tmp_path, float(np.median(values))))
    assert (code, doc["cases"][0]["suspects"], doc["cases"][0]["last_within"]) == (0, [], None)
