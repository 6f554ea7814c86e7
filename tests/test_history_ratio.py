"""The history gate (compare --history) judges a pair's optimized/baseline ratio as well as its
time (issue 34 point 3): a faster machine (the baseline variant x0.90) hid a regression of the
optimized variant (x0.99: its ratio +10%), which the gate passed at "+6.6%". A clear ratio move
beyond the level and the threshold is the case's verdict whatever the machine did; a machine's
move alone (both variants alike) is never one."""

from __future__ import annotations

import datetime as _dt
import json

import numpy as np
import pytest

from gpubench.gate.compare import MIN_SAMPLES_FOR_RATIO
from gpubench.gate.history import open_store, rows_of_file, rows_of_run
from gpubench.gate.history.judge import judge_run
from gpubench.records.results import SCHEMA_VERSION, RunRecord

START = _dt.datetime(2026, 12, 1, tzinfo=_dt.timezone.utc)


def _doc(index: int, fused, loop) -> dict:
    """One run's results document: the case's optimized variant (fused) and baseline variant (loop),
    their timed calls."""
    variants = {
        "loop": {"role": "baseline", "status": "ok", "samples_s": list(loop)},
        "fused": {"role": "optimized", "status": "ok", "samples_s": list(fused)},
    }
    return {
        "kind": "gpubench.results",
        "schema_version": SCHEMA_VERSION,
        "run_id": f"run{index:02d}",
        "device": "cuda:0",
        "device_label": "NVIDIA H100",
        "status": "complete",
        "scenario": {"name": "s", "entries": []},
        "started_at": (START + _dt.timedelta(hours=index)).isoformat(),
        "env": {"host": "ci-1", "git": {"commit": f"c{index:02d}", "branch": "main"}},
        "cases": [
            {
                "id": "t[n=1]",
                "technique": "t",
                "params": {},
                "seed": 0,
                "policy": {},
                "status": "passed",
                "gate_metric": "",
                "variants": variants,
            }
        ],
    }


def _pair(rng, fused: float, loop: float, rounds: int = 30) -> tuple:
    """Interleaved rounds: each round's machine noise (3%) shared by its two variants, 1% their own."""
    shared = rng.normal(1, 0.03, rounds)
    return (0.8 * fused * shared * rng.normal(1, 0.01, rounds), loop * shared * rng.normal(1, 0.01, rounds))


def _judge(tmp_path, fused: float, loop: float, rounds: int = 30, results_file: bool = False):
    """12 runs of unchanged code, then a run with the variants at ``fused`` and ``loop`` times their
    level, judged from its document (``results_file``: from the results.json its rows name)."""
    rng = np.random.default_rng(0)
    history = [_doc(i, *_pair(rng, 1.0, 1.0)) for i in range(12)]
    current = _doc(12, *_pair(rng, fused, loop, rounds))
    with open_store(tmp_path / "h.sqlite") as store:
        store.add([row for doc in history for row in rows_of_run(RunRecord.from_dict(doc), f"runs/{doc['run_id']}")])
        if results_file:
            (tmp_path / "results.json").write_text(json.dumps(current))
            (verdict,) = judge_run(store, rows_of_file(tmp_path / "results.json"), 0.05, branch="main")
        else:
            run = RunRecord.from_dict(current)
            (verdict,) = judge_run(store, rows_of_run(run, "runs/now"), 0.05, branch="main", run=run)
    return verdict


def test_a_regression_a_faster_machine_hides_is_regressed_by_its_ratio(tmp_path):
    # Issue 34's history: from run 9 the baseline variant x0.90, the optimized x0.99; before, the
    # gate read the optimized variant's -1% as passed, and the baseline variant's move only ever
    # demoted a verdict.
    verdict = _judge(tmp_path, 0.99, 0.90)
    assert verdict.verdict == "regressed", verdict
    assert verdict.current / verdict.level_median == pytest.approx(0.99, abs=0.03)  # its own time: passed before
    assert verdict.ratio_move == pytest.approx(0.10, abs=0.03) and verdict.machine_move == pytest.approx(
        -0.10, abs=0.03
    )
    assert (
        "optimized/baseline ratio moved +" in verdict.reason
        and "the ratio decides, not the optimized variant's own" in verdict.reason
    )


def test_the_mirror_a_gain_a_slower_machine_hides_is_improved_by_its_ratio(tmp_path):
    verdict = _judge(tmp_path, 1.0, 1.12)
    assert verdict.verdict == "improved", verdict


@pytest.mark.parametrize("fused,loop", [(0.90, 0.90), (1.10, 1.10), (1.0, 1.0), (1.0, 1.03)])
def test_a_machine_that_moved_both_variants_alike_raises_no_alarm(tmp_path, fused, loop):
    # unchanged code on a faster, slower or steady machine: the ratio did not move beyond its level
    assert _judge(tmp_path, fused, loop).verdict in ("passed", "inconclusive")


def test_a_ratio_move_within_half_the_machine_s_move_raises_nothing(tmp_path):
    # the machine 30% slower: unchanged code's ratio moves its way by up to half of that (MACHINE_SHARE),
    # so +8% is no evidence, though beyond the level and the threshold
    assert _judge(tmp_path, 1.30 * 1.08, 1.30).verdict == "inconclusive"


def test_a_ratio_read_from_too_few_samples_raises_nothing(tmp_path):
    # the current run's variants of 4 calls each (a loaded machine's time cap): no raise on so little
    # (under stats.MIN_CI_SAMPLES the run's figure judges nothing: inconclusive, never regressed)
    verdict = _judge(tmp_path, 0.99, 0.90, rounds=MIN_SAMPLES_FOR_RATIO - 1)
    assert verdict.verdict == "inconclusive" and "too few samples" in verdict.reason, verdict


def test_compare_history_reads_the_ratio_ci_from_the_judged_results_file(tmp_path):
    # `gpubench compare --history RUN` passes rows only: the judge reads the run's samples again
    # from the results file the rows name
    assert _judge(tmp_path, 0.99, 0.90, results_file=True).verdict == "regressed"


def test_a_slowdown_the_machine_more_than_explains_is_improved_when_the_ratio_clearly_says_so(tmp_path):
    # the machine 30% slower, the optimized variant only 15%: its ratio to the baseline variant
    # -11.5%, the code got better (before: inconclusive, the ratio only consulted to demote)
    verdict = _judge(tmp_path, 1.15, 1.30)
    assert verdict.verdict == "improved", verdict
    assert "the other way" in verdict.reason


@pytest.mark.parametrize("status, kind", [("failed", "check"), ("failed", "overloaded"), ("failed", "timeout")])
def test_a_case_that_did_not_pass_fails_the_history_gate_whatever_its_figure(tmp_path, status, kind):
    # Review of issue 34: a wrong result (its figure at the level) read "passed", and a timeout on an
    # overloaded machine "no_figure", both exit 0; the pairwise gate fails them, as docs/history.md says.
    rng = np.random.default_rng(0)
    history = [_doc(i, *_pair(rng, 1.0, 1.0)) for i in range(12)]
    current = _doc(12, *_pair(rng, 1.0, 1.0))
    current["cases"][0].update(status=status, failure={"kind": kind, "message": f"planted {kind}"})
    if kind != "check":  # a timeout: nothing recorded
        current["cases"][0]["variants"] = {}
    with open_store(tmp_path / "h.sqlite") as store:
        store.add([row for doc in history for row in rows_of_run(RunRecord.from_dict(doc), f"runs/{doc['run_id']}")])
        run = RunRecord.from_dict(current)
        (verdict,) = judge_run(store, rows_of_run(run, "runs/now"), 0.05, branch="main", run=run)
    assert verdict.verdict == "failed" and f"planted {kind}" in verdict.reason, verdict
    assert "nothing measured to judge" in verdict.reason


def test_compare_history_exits_1_on_a_case_that_failed(tmp_path):
    from click.testing import CliRunner

    from gpubench.cli import main

    rng = np.random.default_rng(1)
    store = tmp_path / "h.sqlite"
    with open_store(store) as opened:
        opened.add(
            [
                row
                for doc in (_doc(i, *_pair(rng, 1.0, 1.0)) for i in range(12))
                for row in rows_of_run(RunRecord.from_dict(doc), f"runs/{doc['run_id']}")
            ]
        )
    current = _doc(12, *_pair(rng, 1.0, 1.0))
    current["cases"][0].update(status="failed", failure={"kind": "check", "message": "wrong result"})
    (tmp_path / "results.json").write_text(json.dumps(current))
    result = CliRunner().invoke(
        main, ["compare", "--history", str(tmp_path / "results.json"), "--store", str(store), "--branch", "main"]
    )
    assert result.exit_code == 1, result.output
    assert "failed" in result.output and "wrong result" in result.output
