"""``gpubench run --budget``: the duration it takes, the breadth-first order (and a scenario's
own), the plan and the admission of each case against the time left, the record of the cases not
run (results.json, summary, report, gate, history), a case in flight stopped at the budget with its
samples kept, and estimates with no history that never claim less than a real run took.

No test depends on the machine's speed: case times come from fake histories, budgets are far
from what the cases take, and the one case cut by the budget runs a timing loop that would go on
for minutes."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.measure import env as envmod
from gpubench.measure.devicecache import CaseTimes
from gpubench.records import results
from gpubench.run import estimate, supervisor
from gpubench.run import scenario as scenariomod
from gpubench.run.budget import GRACE_S, Budget, breadth_first, parse_duration, plan
from gpubench.run.estimate import CaseCosts

CPU = torch.device("cpu")
POLICY = """policy: {warmup_s: 0.0, min_reps: 3, max_reps: 5, min_time_s: 0.0, max_time_s: 0.3, target_iqr: 1.0,
         case_timeout_s: 300, energy_s: 0}
"""


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _write(tmp_path: Path, order: str = "", policy: str = POLICY) -> Path:
    """toy_kernel at three sizes, toy_train_step at two: five cases of two techniques."""
    path = tmp_path / "budget.yaml"
    path.write_text(
        f"name: budget\n{policy}{order}entries:\n"
        "  - technique: toy_kernel\n    params: {n: [64, 128, 256]}\n"
        "  - technique: toy_train_step\n    params: {dim: [4, 8]}\n"
    )
    return path


def _cpu_history(seconds: dict[str, float], overhead_s: float = 1.0, report_s: float = 0.001) -> CaseTimes:
    """A fake case-time history for this machine's CPU: each case id's time, a run's fixed cost,
    the report's time per case."""
    history = CaseTimes(envmod.device_label(CPU))
    history.path.parent.mkdir(parents=True, exist_ok=True)
    history.path.write_text(
        json.dumps(
            {
                "schema": 1,
                "device": history.device_label,
                "run_overheads_s": [overhead_s],
                "report_s_per_case": [report_s],
                "cases": {
                    CaseTimes.key(case_id, 1.0): {"s": s, "at": "2026-01-01T00:00:00+00:00"}
                    for case_id, s in seconds.items()
                },
            }
        )
    )
    return history


def _ids(scen: scenariomod.Scenario) -> dict[str, str]:
    """Short names (k64, k128, k256, t4, t8) -> case ids."""
    return {(f"k{c.params['n']}" if c.technique == "toy_kernel" else f"t{c.params['dim']}"): c.id for c in scen.cases()}


# -- DURATION -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("540", 540),
        ("540s", 540),
        ("9m", 540),
        ("1h30m", 5400),
        ("1h", 3600),
        ("2m30s", 150),
        ("1.5h", 5400),
        (" 90S ", 90),
        ("0.5m", 30),
    ],
)
def test_a_duration_reads_in_seconds_minutes_hours_and_their_combinations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "9x", "m", "1m1h", "-5", "0", "0s", "1hm", "nine minutes", "5ms"])
def test_a_bad_duration_is_refused_naming_the_forms(text):
    with pytest.raises(BadInput, match=r"--budget: .* allowed: seconds \(540 or 540s\), minutes \(9m\)"):
        parse_duration(text)


def test_a_bad_budget_on_the_command_line_is_exit_2_with_the_forms(toys, tmp_path):
    result = invoke("run", "--scenario", _write(tmp_path), "--budget", "9x", "--out", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    assert "--budget: '9x' is not a duration; allowed: seconds (540 or 540s), minutes (9m)" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


# -- order ------------------------------------------------------------------------------------------


def test_breadth_first_takes_each_techniques_first_case_before_any_second(toys, tmp_path):
    scen = scenariomod.load(_write(tmp_path))
    names = {v: k for k, v in _ids(scen).items()}
    assert [names[c.id] for c in breadth_first(scen.cases())] == ["k64", "t4", "k128", "t8", "k256"]
    # the scenario's order puts its techniques first in every round; each keeps its own case order
    assert [names[c.id] for c in breadth_first(scen.cases(), ("toy_train_step",))] == [
        "t4",
        "k64",
        "t8",
        "k128",
        "k256",
    ]


def test_a_scenario_sets_the_order_and_a_bad_order_is_exit_2(toys, tmp_path):
    scen = scenariomod.load(_write(tmp_path, "order: [toy_train_step]\n"))
    assert scen.order == ("toy_train_step",) and scen.to_dict()["order"] == ["toy_train_step"]
    for bad, message in (
        ("order: toy_train_step\n", "order: must be a list of technique names"),
        ("order: [flash_attention]\n", "'flash_attention' is not a technique of this scenario's entries"),
        ("order: [toy_kernel, toy_kernel]\n", "'toy_kernel' is given twice"),
    ):
        result = invoke("run", "--scenario", _write(tmp_path, bad), "--dry-run")
        assert result.exit_code == 2 and message in result.output, (bad, result.output)


def test_without_a_budget_the_run_keeps_the_scenarios_order(toys, tmp_path):
    outcome = supervisor.run_scenario(
        scenariomod.load(_write(tmp_path)), supervisor.RunOptions(isolation="none"), tmp_path / "runs", calibrate=False
    )
    names = {v: k for k, v in _ids(scenariomod.load(_write(tmp_path))).items()}
    assert [names[c.id] for c in outcome.record.cases] == ["k64", "k128", "k256", "t4", "t8"]
    assert outcome.record.not_run == [] and outcome.record.budget_s is None and "budget_s" not in outcome.doc


# -- the plan and the admission ---------------------------------------------------------------------


def test_the_plan_passes_over_a_case_the_budget_cannot_hold_and_runs_smaller_later_ones(toys, tmp_path):
    scen = scenariomod.load(_write(tmp_path))
    ids = _ids(scen)
    _cpu_history({ids["k64"]: 10, ids["k128"]: 5000, ids["k256"]: 10, ids["t4"]: 10, ids["t8"]: 10})
    costs = CaseCosts(CPU, history=CaseTimes(envmod.device_label(CPU)))
    steps = plan(breadth_first(scen.cases()), costs, budget_s=100)
    by_name = {k: next(s for s in steps if s.case.id == v) for k, v in ids.items()}
    assert by_name["k128"].start_s is None  # 5000 s x 1.25 cannot fit 100 s
    margin = estimate.HISTORY_MARGIN * 10
    assert [round(by_name[k].start_s, 6) for k in ("k64", "t4", "t8", "k256")] == [
        1.0,
        1 + margin,
        1 + 2 * margin,
        1 + 3 * margin,
    ]
    # two workers: two cases at a time
    two = plan(breadth_first(scen.cases()), CaseCosts(CPU, history=CaseTimes(envmod.device_label(CPU))), 100, workers=2)
    assert [s.start_s for s in two[:2]] == [1.0, 1.0]
    # a budget that cannot hold even the start-up runs nothing
    assert all(s.start_s is None for s in plan(scen.cases(), costs, budget_s=5))


def test_admission_counts_the_time_left_and_caps_a_case_at_it_plus_the_grace(toys, tmp_path):
    scen = scenariomod.load(_write(tmp_path))
    ids = _ids(scen)
    _cpu_history({ids["k64"]: 10, ids["t4"]: 10})
    now = [1000.0]
    budget = Budget(
        100, CaseCosts(CPU, history=CaseTimes(envmod.device_label(CPU))), started_at=1000.0, clock=lambda: now[0]
    )
    cases = {c.id: c for c in scen.cases()}
    closing = estimate.CLOSE_S + 0.001
    assert budget.admit(cases[ids["k64"]]) == pytest.approx(100 - closing + GRACE_S)
    now[0] = 1090.0  # 10 s left, less closing: 12.5 s cannot fit
    assert budget.admit(cases[ids["t4"]]) is None
    skipped = budget.not_run[0]
    assert (skipped.id, skipped.reason, skipped.estimate_s, skipped.basis) == (ids["t4"], "budget", 12.5, "history")
    assert skipped.left_s == pytest.approx(10 - (estimate.CLOSE_S + 0.002), abs=1e-3)
    # a case with no history counts the upper figure: its policy's longest plus the allowances
    guess = budget.costs.of(cases[ids["k128"]])
    assert guess.basis == "policy" and guess.lower_bound
    assert guess.plan_s >= 0.3 + estimate.FIXED_CASE_S["cpu"] and guess.low_s == 0.0


def test_fill_budget_admits_on_the_lower_figure_so_the_budget_is_used_to_its_end(toys, tmp_path):
    """With no case times on a device, the conservative figures (allowances for first compiles and
    checks) would leave a budget's end unused: --fill-budget starts a case while the time left holds
    what it takes at least; the case is still capped at the time left."""
    scen = scenariomod.load(_write(tmp_path))
    ids = _ids(scen)
    _cpu_history({ids["k64"]: 10})  # one case measured here; the others from their policy alone
    cases = {c.id: c for c in scen.cases()}
    now = [1000.0]

    def budget(fill: bool) -> Budget:
        return Budget(
            100,
            CaseCosts(CPU, history=CaseTimes(envmod.device_label(CPU))),
            started_at=1000.0,
            clock=lambda: now[0],
            fill=fill,
        )

    conservative, filling = budget(False), budget(True)
    now[0] = 1100.0 - estimate.CLOSE_S - 5.0  # 5 s left beside closing the run
    unknown = cases[ids["k128"]]
    assert conservative.costs.of(unknown).plan_s > 5.0 >= conservative.costs.of(unknown).low_s
    assert conservative.admit(unknown) is None
    assert filling.admit(unknown) == pytest.approx(5.0 - 0.001 + GRACE_S, abs=1e-3)  # capped at the time left
    assert filling.admit(cases[ids["k64"]]) is None  # its own 10 s cannot fit, fill or not

    # the plan says the same: 3 s after start-up and closing hold no conservative figure
    def started(fill: bool) -> list[str]:
        costs = CaseCosts(CPU, history=CaseTimes(envmod.device_label(CPU)))
        steps = plan(breadth_first(scen.cases()), costs, budget_s=1.0 + estimate.CLOSE_S + 3.0, fill=fill)
        return [s.case.id for s in steps if s.start_s is not None]

    assert started(False) == [] and ids["t4"] in started(True) and ids["k64"] not in started(True)


def test_fill_budget_without_a_budget_is_exit_2(toys, tmp_path):
    result = invoke("run", "--scenario", _write(tmp_path), "--device", "cpu", "--fill-budget", "--out", tmp_path)
    assert result.exit_code == 2 and "--fill-budget: only with --budget" in result.output


# -- a real run under a budget ----------------------------------------------------------------------


def test_a_budget_run_records_what_it_passed_over_and_every_reader_says_so(toys, tmp_path):
    path = _write(tmp_path)
    ids = _ids(scenariomod.load(path))
    _cpu_history({ids["k64"]: 0.1, ids["k128"]: 5000, ids["k256"]: 0.1, ids["t4"]: 0.1, ids["t8"]: 0.1})
    out = tmp_path / "runs"
    result = invoke("run", "--scenario", path, "--budget", "1h", "--out", out, "--no-calibrate")
    assert result.exit_code == 0, result.output  # only the budget left a case out, and everything that ran passed
    run_dir = next(out.glob("*-budget"))
    doc = json.loads((run_dir / "results.json").read_text())
    assert doc["status"] == "complete" and doc["budget_s"] == 3600
    assert [c["id"] for c in doc["cases"]] == [ids[k] for k in ("k64", "t4", "t8", "k256")]  # breadth-first
    assert doc["summary"] == {"cases": 4, "passed": 4, "failed": 0, "interrupted": 0, "not_run": 1}
    (skipped,) = doc["not_run"]
    assert (skipped["id"], skipped["reason"], skipped["status"], skipped["estimate_s"]) == (
        ids["k128"],
        "budget",
        "not_run",
        6250.0,
    )
    assert "not run toy_kernel n=128  budget: would need about 1.7 h" in result.output
    assert "4 passed, 0 failed, 1 not run: budget (complete)" in result.output
    assert "1 case not run: budget (would have needed about 1.7 h); the budget was 60 min (--budget)" in result.output
    # the report lists it; summary.md counts it
    html = (run_dir / "report.html").read_text()
    assert 'id="not-run"' in html and "1 not run: budget" in html and "n=128" in html
    assert "1 not run: budget" in (run_dir / "summary.md").read_text()
    # read back as records, and by the gate: missing, never a pass; --allow-missing passes what ran
    record = results.load_run(run_dir)
    assert record.not_run[0].id == ids["k128"] and record.summary["not_run"] == 1
    gate = invoke("compare", run_dir, run_dir)
    assert gate.exit_code == 1, gate.output
    assert "1 missing (1 not run: budget)" in gate.output and "not run: budget" in gate.output
    allowed = invoke("compare", run_dir, run_dir, "--allow-missing")
    assert allowed.exit_code == 0, allowed.output
    # neither the history store nor the case-time history holds it as a measurement
    with sqlite3.connect(_store_path()) as db:
        stored = {row[0] for row in db.execute("SELECT DISTINCT case_id FROM gpubench_results")}
    assert ids["k128"] not in stored and ids["k64"] in stored
    assert CaseTimes(envmod.device_label(CPU)).read()[0][CaseTimes.key(ids["k128"], 1.0)] == 5000


def _store_path() -> Path:
    import os

    return Path(os.environ["GPUBENCH_HISTORY"])


def test_a_case_in_flight_when_the_budget_runs_out_is_stopped_and_keeps_its_samples(toys, tmp_path, monkeypatch):
    # A timing loop that would run for minutes (min_time_s 100); the budget has about 3 s left when
    # the run starts (as if it had started long before), and each case's history says 0.1 s.
    long = """policy: {warmup_s: 0.0, min_reps: 3, max_reps: 100000000, min_time_s: 100, max_time_s: 200, target_iqr: 0.0001,
         case_timeout_s: 300, energy_s: 0}
"""
    path = _write(tmp_path, policy=long)
    scen = scenariomod.load(path)
    _cpu_history({c.id: 0.1 for c in scen.cases()}, report_s=0.0)
    monkeypatch.setattr(estimate, "CLOSE_S", 0.0)
    options = supervisor.RunOptions(isolation="none", budget_s=1000.0, budget_from=time.monotonic() - 997.0)
    t0 = time.monotonic()
    outcome = supervisor.run_scenario(scen, options, tmp_path / "runs", calibrate=False)
    assert time.monotonic() - t0 < 60  # stopped at the budget, not at the loop's 200 s or the case's 300 s
    (first,) = outcome.record.cases
    assert first.status == "interrupted" and first.failure.kind == "budget"
    assert "the run's --budget ran out" in first.failure.message
    ran = [v for v in first.variants.values() if v.status != "skipped"]
    assert len(ran) == 3 and all(len(v.samples_s) >= 3 for v in ran), first.variants  # what it measured is kept
    assert len(outcome.record.not_run) == 4 and outcome.exit_code == 0
    # the gate does not pass a case the budget cut short
    from gpubench.gate.compare import compare

    change = next(c for c in compare(outcome.record, outcome.record).changes if c.case_id == first.id)
    assert change.verdict == "missing" and change.reason.startswith("not run to the end: budget")
    # nor does the history store take its partial samples for a level
    from gpubench.gate.history.rows import rows_of_run

    rows = rows_of_run(outcome.record, outcome.run_dir / "results.json")
    on_disk = results.load_run(outcome.run_dir).cases[0]
    assert rows == [] and [v.samples_s for v in on_disk.variants.values()] == [
        v.samples_s for v in first.variants.values()
    ]


def test_a_worker_process_stops_its_case_at_the_budget_and_sends_its_samples(toys, tmp_path, monkeypatch):
    """The time limit the supervisor computes travels with the job to the worker, whose alarm stops
    the case there (the budget's time left is fixed at 3 s here, whenever the worker starts)."""
    path = tmp_path / "one.yaml"
    path.write_text(
        "name: one\npolicy: {warmup_s: 0.0, min_reps: 3, max_reps: 100000000, min_time_s: 100, "
        "max_time_s: 200, target_iqr: 0.0001, case_timeout_s: 300, energy_s: 0}\n"
        "entries:\n  - technique: toy_kernel\n    params: {n: 20000}\n"
    )  # ms a call: a few hundred samples
    scen = scenariomod.load(path)
    _cpu_history({c.id: 0.1 for c in scen.cases()}, report_s=0.0)
    monkeypatch.setattr(estimate, "CLOSE_S", 0.0)
    monkeypatch.setattr(Budget, "left_s", lambda self: 3.0)
    t0 = time.monotonic()
    outcome = supervisor.run_scenario(scen, supervisor.RunOptions(budget_s=1000.0), tmp_path / "runs", calibrate=False)
    assert time.monotonic() - t0 < 120
    (case,) = outcome.record.cases
    assert case.status == "interrupted" and case.failure.kind == "budget", case.failure
    assert f"stopped after {3.0 + GRACE_S:.1f} s" in case.failure.message
    assert all(len(v.samples_s) >= 3 for v in case.variants.values() if v.status != "skipped")
    assert outcome.record.status == "complete" and outcome.exit_code == 0


def test_dry_run_with_a_budget_shows_the_plan_in_run_order(toys, tmp_path):
    path = _write(tmp_path)
    ids = _ids(scenariomod.load(path))
    _cpu_history({ids["k64"]: 10, ids["k128"]: 5000, ids["k256"]: 10, ids["t4"]: 10, ids["t8"]: 10})
    out = tmp_path / "runs"
    result = invoke("run", "--scenario", path, "--budget", "100s", "--dry-run", "--out", out)
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    plan_lines = [" ".join(line.split()) for line in lines if line[:1].isdigit() and ". " in line]
    assert plan_lines == [
        "1. at 1.0 s toy_kernel n=64 (about 10 s, counted as 12 s)",
        "2. at 14 s toy_train_step dim=4 (about 10 s, counted as 12 s)",
        "3. not run: budget toy_kernel n=128 (about 83 min, counted as 1.7 h; 69 s left then)",
        "4. at 26 s toy_train_step dim=8 (about 10 s, counted as 12 s)",
        "5. at 38 s toy_kernel n=256 (about 10 s, counted as 12 s)",
    ], plan_lines
    assert "would run 4 of 5 cases; 1 case not run: budget (would have needed about 1.7 h)" in result.output
    assert not out.exists()


def test_an_older_results_file_reads_with_no_case_left_out():
    record = results.RunRecord.from_dict({"run_id": "r", "status": "complete", "cases": []})
    assert record.not_run == [] and record.summary["not_run"] == 0 and record.budget_s is None


# -- estimates with no history ----------------------------------------------------------------------


def test_with_no_history_an_estimate_is_a_lower_bound_below_what_each_case_took(small_run_dir):
    """Every technique at a small case, run for real: no case took less than the estimate's
    'at least', and the text claims no upper bound."""
    import report_runs

    run = results.load_run(small_run_dir)
    scen = scenariomod.parse(report_runs.SCENARIO, Path("report-test.yaml"))
    costs = CaseCosts(CPU)
    took = {c.id: c.elapsed_s for c in run.cases}
    for case in scen.cases():
        guess = costs.of(case)
        assert guess.lower_bound and guess.low_s <= took[case.id], (case.id, guess, took[case.id])
    # warm-up 0: the policy bounds nothing from below, and the estimate claims no span
    text = estimate.estimate(scen, None, CPU, out_root=None).text()
    assert text.startswith("not measured here (a --budget counts ") and " to " not in text.split("(")[0], text
    warm = scenariomod.parse(report_runs.SCENARIO.replace("warmup_s: 0,", "warmup_s: 0.01,"), Path("warm.yaml"))
    assert estimate.estimate(warm, None, CPU, out_root=None).text().startswith("at least ")


def test_with_no_history_a_budget_counts_no_less_than_a_small_real_run_took(toys, tmp_path):
    """A tiny run in a worker process: each case took less than the figure a budget counts for it
    with no history, and the run's start-up and close less than the allowances for them."""
    scen = scenariomod.load(_write(tmp_path))
    outcome = supervisor.run_scenario(scen, supervisor.RunOptions(), tmp_path / "runs")
    costs = CaseCosts(CPU)
    planned = {}
    for case in scen.cases():
        planned[case.id] = costs.of(case).plan_s
        costs.started(case)
    for case in outcome.record.cases:
        assert case.status == "passed" and case.elapsed_s <= planned[case.id], (
            case.id,
            case.elapsed_s,
            planned[case.id],
        )
    use = outcome.record.time_use
    assert use.wall_s - use.cases_s <= costs.startup_s() + costs.closing_s(len(outcome.record.cases))
