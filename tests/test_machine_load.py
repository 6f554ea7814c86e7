"""A busy machine is not a failed case: a case's time limit grows with the machine's load at its
start (within a cap), the record keeps the limit and the load, and a case that still passes its
limit on an overloaded machine says which limit and what load, as a timeout of the run's
environment (its own exit code), never as a passed case. The load and the clock are faked."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from inprocess import run_in_process

from gpubench.measure import machine_load
from gpubench.measure.machine_load import LIMIT_SCALE_CAP, Load, TimeLimit, scale_for
from gpubench.records.results import CaseRecord, Failure, RunRecord
from gpubench.run import outcome as outcomes
from gpubench.run import runner, scenario

ONE_CASE = """\
name: busy
entries:
  - technique: toy_kernel
    params: {n: 16, mode: ok}
policy: {warmup_s: 0, min_reps: 3, max_reps: 4, min_time_s: 0, max_time_s: 0.5, target_iqr: 1.0, case_timeout_s: 300, energy_s: 0}
"""


@pytest.mark.parametrize(
    "load,scale",
    [
        (Load(0.3, 2), 1.0),
        (Load(2.0, 2), 1.0),
        (Load(5.0, 2), 2.5),
        (Load(11.0, 2), LIMIT_SCALE_CAP),
        (Load(40.0, 16), 2.5),
        (None, 1.0),
    ],
)
def test_a_limit_scales_by_load_per_core_never_below_one_never_above_the_cap(load, scale):
    """Load per logical core: an idle or fully used machine keeps the policy's limit, a busier one
    stretches it as much as each case slows (a share of a core), at most x4; no load average
    (a platform without one) keeps the policy's limit."""
    assert scale_for(load) == scale
    assert machine_load.time_limit(300.0, lambda: load).seconds == pytest.approx(300.0 * scale)


def _timed_out_run(monkeypatch, write_scenario, tmp_path, loads):
    """ONE_CASE run in process with the load read as ``loads`` (until the case's alarm is set, then
    at its timeout) and an alarm that goes off at once, the clock saying the limit's seconds passed."""
    start, now = loads
    limits = []
    monkeypatch.setattr(machine_load, "read", lambda: now if limits else start)

    @contextlib.contextmanager
    def alarm_at_once(seconds, budget=False):
        limits.append(seconds)
        raise runner.CaseTimeout("the alarm")
        yield  # unreachable: a generator, as contextmanager wants

    monkeypatch.setattr(runner, "deadline", alarm_at_once)
    # the case starts at 0; once the alarm is set, the clock reads its limit
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: limits[0] if limits else 0.0))
    outcome = run_in_process(
        scenario.load(write_scenario(ONE_CASE)), torch.device("cpu"), tmp_path / "runs", calibrate=False
    )
    return outcome, limits


def test_a_case_on_a_busy_machine_gets_a_longer_limit_and_its_timeout_names_the_limit_and_the_load(
    toys, write_scenario, tmp_path, monkeypatch
):
    """At load 5 on 2 cores the 300 s limit becomes 750 s (the alarm is set to it, the record keeps
    it with the load); timed out at load 11, the case says so in those words, as kind
    ``overloaded`` (the environment's, not the technique's), and the run exits 75, not 1."""
    outcome, limits = _timed_out_run(monkeypatch, write_scenario, tmp_path, [Load(5.0, 2), Load(11.0, 2)])
    assert limits == [750.0]
    case = outcome.record.cases[0]
    assert case.time_limit == {
        "limit_s": 750.0,
        "case_timeout_s": 300.0,
        "scale": 2.5,
        "load": {"load_1m": 5.0, "cpus": 2},
    }
    assert case.status == "failed" and case.failure.kind == "overloaded"
    assert case.failure.message.startswith(
        "timed out after 750 s (limit 300 s x2.5; machine at load 11.0 on 2 cores, 5.0 at the case's start): "
        "the machine was overloaded, so this is a timeout of the run's environment, not a failure of the technique"
    )
    assert "CaseTimeout: the alarm" in case.failure.traceback  # where the case was, kept
    assert outcome.exit_code == outcomes.EXIT_OVERLOADED == 75


def test_a_timeout_on_a_quiet_machine_is_a_failed_case_with_its_limit_and_load(
    toys, write_scenario, tmp_path, monkeypatch
):
    """Load 0.5 on 2 cores: the policy's limit unscaled, and passing it is a plain timeout (a hang,
    or a case too slow for its limit): exit 1."""
    outcome, limits = _timed_out_run(monkeypatch, write_scenario, tmp_path, [Load(0.5, 2), Load(0.6, 2)])
    assert limits == [300.0]
    case = outcome.record.cases[0]
    assert case.failure.kind == "timeout"
    assert case.failure.message == (
        "timed out after 300 s (limit 300 s x1.0; machine at load 0.6 on 2 cores, 0.5 at the case's start)"
    )
    assert outcome.exit_code == outcomes.EXIT_FAILED


def _record(*failures):
    cases = [
        CaseRecord(
            id=f"c{i}",
            technique="t",
            params={},
            seed=0,
            policy={},
            status="passed" if f is None else "failed",
            failure=f,
        )
        for i, f in enumerate(failures)
    ]
    return outcomes.RunOutcome(Path("."), RunRecord("r", "cpu", "", {}, {}, status="complete", cases=cases))


def test_the_run_exits_75_only_when_every_failed_case_timed_out_on_an_overloaded_machine():
    """Overloaded timeouts alone: 75 (sysexits' EX_TEMPFAIL: try again); with any other failure,
    a timeout on a quiet machine among them, 1; nothing failed: 0."""
    overloaded = Failure("overloaded", "timed out after 1200 s (limit 300 s x4.0; machine at load 11.0 on 2 cores)")
    assert _record(None, overloaded).exit_code == 75
    assert _record(overloaded, Failure("check", "optimized: wrong")).exit_code == 1
    assert _record(overloaded, Failure("timeout", "timed out after 300 s")).exit_code == 1
    assert _record(None, None).exit_code == 0


def test_the_limit_the_supervisor_kills_at_is_the_scaled_one(toys):
    """The job a worker gets carries the scaled limit, so the supervisor's kill (limit + grace)
    waits for it, and a budget longer than the scaled limit does not count as the limit."""
    from gpubench.run.executor import Sink, job_kill_grace_s
    from gpubench.run.worker import Job

    case = scenario.parse(ONE_CASE, Path("busy.yaml")).cases()[0]
    sink = Sink(SimpleNamespace(), SimpleNamespace(), load_probe=lambda: Load(6.0, 2))
    job = sink.admit(Job(0, case, "toys:KERNEL", None))
    assert job.time_limit == TimeLimit(300.0, 3.0, Load(6.0, 2))
    assert job.limit_s == 900.0 and not job.budget_limited
    assert job_kill_grace_s(job) == 90.0  # 10% of the scaled limit
    assert Job(0, case, "toys:KERNEL", None, budget_s=600.0, time_limit=job.time_limit).budget_limited
    assert not Job(0, case, "toys:KERNEL", None, budget_s=1000.0, time_limit=job.time_limit).budget_limited


def test_a_worker_killed_past_its_scaled_limit_names_the_limit_and_the_load(toys, monkeypatch):
    """The supervisor's kill (a native call the alarm cannot stop) words the timeout as the alarm
    does: the scaled limit, the load at the start and at the kill; overloaded there, kind
    ``overloaded``; the record keeps the limit."""
    import time

    from gpubench.run.local_workers import LocalWorkers
    from gpubench.run.worker import DeviceInfo, Job

    case = scenario.parse(ONE_CASE, Path("busy.yaml")).cases()[0]
    job = Job(0, case, "toys:KERNEL", None, time_limit=TimeLimit(300.0, 2.5, Load(5.0, 2)))
    monkeypatch.setattr(machine_load, "read", lambda: Load(12.0, 2))
    workers = LocalWorkers.__new__(LocalWorkers)
    workers.states = {"cpu": SimpleNamespace(info=DeviceInfo("cpu", "cpu", None, "CPU: test"))}
    workers._replace = lambda w: None
    slot = SimpleNamespace(
        job=job, key="cpu", started_at=time.monotonic() - 830.0, kill=lambda: None, log_tail=lambda: ""
    )
    finished = []
    workers._time_out(slot, SimpleNamespace(finished=lambda j, record: finished.append(record)))
    (record,) = finished
    assert record.status == "failed" and record.failure.kind == "overloaded"
    assert record.failure.message.startswith("timeout (worker killed after 830.")
    assert (
        "(limit 300 s x2.5; machine at load 12.0 on 2 cores, 5.0 at the case's start): the machine was overloaded"
    ) in record.failure.message
    assert record.time_limit["limit_s"] == 750.0


def test_a_run_s_own_threads_do_not_make_a_machine_overloaded():
    """Review of issue 34: the load counts the benchmark's own runnable threads (torch's two and the
    worker's main thread on 2 cores: about 3); a case hung on an otherwise idle machine must read as
    a timeout (exit 1), not as the environment's (exit 75). Twice the cores is the line."""
    assert not Load(3.0, 2).overloaded and not Load(4.0, 2).overloaded
    assert Load(4.5, 2).overloaded and Load(11.0, 2).overloaded
    assert machine_load._cpus() >= 1
