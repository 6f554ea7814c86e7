"""Device time and wall time (issue 33, point 4): what a GPU sample measures, which clock a
technique's headline is on, how records keep both and how the gate compares them.

No GPU here: the CUDA clock is driven by a fake ``torch.cuda`` that logs the order of operations
(the property is the order: no host sync between the flush and the start event; the host clock
spanning the launch), and the harness's two-clock loop by a clock that returns fixed figures.
"""

from __future__ import annotations

import pytest
import torch

from gpubench.contract import SHAPE_TIME_BASIS, Technique
from gpubench.gate import compare
from gpubench.measure import timing
from gpubench.records.results import CaseRecord, RunRecord, Timing, VariantRecord
from gpubench.reports import sections, terminal
from gpubench.run import runner
from gpubench.run.scenario import Case

CPU = torch.device("cpu")
QUICK = timing.Policy(warmup_s=0.0, min_reps=4, max_reps=4, min_time_s=0.0, target_iqr=1.0, energy_s=0.0)


# -- the CUDA clock, faked: the order of operations ---------------------------------------------------
class FakeEvent:
    def __init__(self, log, name, elapsed_ms):
        self.log, self.name, self.elapsed_ms = log, name, elapsed_ms

    def record(self):
        self.log.append(f"{self.name}.record")

    def synchronize(self):
        self.log.append(f"{self.name}.synchronize")

    def elapsed_time(self, end):
        self.log.append("elapsed_time")
        return self.elapsed_ms


class FakeFlush:
    def __init__(self, log):
        self.log = log

    def zero_(self):
        self.log.append("flush")


@pytest.fixture
def cuda_clock(monkeypatch):
    """A Clock on ``cuda`` whose torch.cuda (events, synchronize) and host clock log what they do."""
    log: list[str] = []
    names = iter(["start", "end"])
    monkeypatch.setattr(timing.torch.cuda, "Event", lambda enable_timing: FakeEvent(log, next(names), 0.25))
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda device=None: log.append("host_sync"))
    ticks = iter(range(1_000_000, 10_000_000, 400_000))  # each read 0.4 ms after the last

    def perf_counter_ns():
        log.append("host_clock")
        return next(ticks)

    monkeypatch.setattr(timing.time, "perf_counter_ns", perf_counter_ns)
    clock = timing.Clock(torch.device("cuda", 0), flush_l2=False)
    clock._flush_buffer = FakeFlush(log)  # a 256 MB buffer on a device this machine lacks
    clock._flush_begin = FakeEvent(log, "flush_begin", 0.1)  # the flush ran 0.1 ms on the GPU
    return clock, log


def test_device_time_queues_the_start_event_behind_the_flush_with_no_host_sync(cuda_clock):
    clock, log = cuda_clock
    seconds = clock.time_call(lambda: log.append("launch"), "device")
    assert log == [
        "host_clock",
        "flush_begin.record",
        "flush",
        "start.record",
        "launch",
        "host_clock",
        "end.record",
        "end.synchronize",
        "elapsed_time",
        "elapsed_time",
    ]
    assert "host_sync" not in log[log.index("flush") : log.index("start.record")]
    assert "host_sync" not in log  # the end event's synchronize is the only wait
    assert seconds == pytest.approx(0.25e-3)  # the events' time, not the host's
    assert clock.method_of("device") == "cuda_event"
    # The launch took 0.4 ms on the host, the flush 0.1 ms on the GPU: the launch may show.
    assert clock.launch_outlasted_flush is True
    clock._flush_begin.elapsed_ms = 1.0
    clock.time_call(lambda: None, "device")
    assert clock.launch_outlasted_flush is False
    clock.time_call(lambda: None, "wall")
    assert clock.launch_outlasted_flush is False  # only a device-time call says


def test_wall_time_starts_after_the_flush_and_spans_the_launch_and_the_final_sync(cuda_clock):
    clock, log = cuda_clock
    seconds = clock.time_call(lambda: log.append("launch"), "wall")
    assert log == ["flush", "host_sync", "host_clock", "launch", "end.record", "end.synchronize", "host_clock"]
    assert seconds == pytest.approx(0.4e-3)  # the host clock's two reads
    assert clock.method_of("wall") == "perf_counter_ns"


def test_a_gpu_clock_refuses_the_cpu_clock_name_and_a_cpu_clock_has_one_clock():
    assert timing.Clock(CPU).basis("device") == timing.Clock(CPU).basis("wall") == "host"
    with pytest.raises(ValueError, match="device' or 'wall"):
        timing.Clock(CPU).basis("elapsed")


# -- the timing loop: two clocks, one call each --------------------------------------------------------
class TwoClocks(timing.Clock):
    """A GPU's two clocks as fixed figures (device 1 ms, wall 1.5 ms); calls run on the CPU."""

    FIGURES = {"device": 1e-3, "wall": 1.5e-3}

    def __init__(self):
        super().__init__(CPU, flush_l2=False)
        self.calls: list[str] = []

    @property
    def one_clock(self) -> bool:
        return False

    def time_call(self, fn, basis="device"):
        self.calls.append(basis)
        fn()
        if basis == "device":  # device-time calls 1, 3, 5 ... outlast the flush
            self.launch_outlasted_flush = self.calls.count("device") % 2 == 1
        return self.FIGURES[basis]

    def shares_one_call(self, headline_s):
        return False  # short calls: the flush is not negligible beside them


class LongCalls(TwoClocks):
    """Calls long beside the flush: once one repetition has shown it, one call gives both clocks."""

    def shares_one_call(self, headline_s):
        return True

    def time_both(self, fn):
        self.calls.append("both")
        fn()
        self.launch_outlasted_flush = False
        return self.FIGURES["device"], self.FIGURES["wall"]


@pytest.mark.parametrize("basis,other", [("device", "wall"), ("wall", "device")])
def test_a_long_call_gives_both_clocks_in_one_call_after_the_first_repetition(basis, other):
    """A serving trace or a training step would otherwise run twice per repetition for a second
    clock the flush cannot disturb: after one repetition of two calls, one call per repetition."""
    clock, seen = LongCalls(), []
    out = timing.measure_interleaved({"a": seen.append}, clock, QUICK, basis=basis)["a"]
    assert clock.calls == [basis] + [basis, other] + ["both"] * 3
    assert out.samples_s == [TwoClocks.FIGURES[basis]] * 4 and out.other_s == [TwoClocks.FIGURES[other]] * 4
    assert out.shared_calls == 3 and len(out.records) == len(out.host_bounds) == 4


def test_one_call_gives_both_clocks_only_where_the_flush_is_at_most_one_percent_of_it(cuda_clock):
    clock, log = cuda_clock
    assert not clock.shares_one_call(1.0)  # the flush's duration is not known yet
    clock.time_call(lambda: None, "device")  # the flush ran 0.1 ms
    assert clock.flush_s == pytest.approx(1e-4)
    assert clock.shares_one_call(0.01) and not clock.shares_one_call(0.009)
    assert not timing.Clock(CPU).shares_one_call(10.0)  # the CPU has one clock anyway


def test_one_call_on_both_clocks_queues_the_start_behind_the_flush_and_spans_the_launch(cuda_clock):
    clock, log = cuda_clock
    device_s, wall_s = clock.time_both(lambda: log.append("launch"))
    assert log[:5] == ["host_clock", "flush_begin.record", "flush", "start.record", "host_clock"]
    assert "host_sync" not in log  # no host sync after the flush: device time as do_bench takes it
    assert log[5:] == [
        "launch",
        "host_clock",
        "end.record",
        "end.synchronize",
        "host_clock",
        "elapsed_time",
        "elapsed_time",
    ]
    assert device_s == pytest.approx(0.25e-3)  # the events
    assert wall_s == pytest.approx(2 * 0.4e-3)  # the host's reads around the launch and the final sync


@pytest.mark.parametrize("basis,other", [("device", "wall"), ("wall", "device")])
def test_each_repetition_is_one_call_per_clock_and_the_headline_list_is_the_basis(basis, other):
    clock, seen = TwoClocks(), []
    out = timing.measure_interleaved({"a": seen.append}, clock, QUICK, basis=basis)["a"]
    assert out.basis == basis and out.other_basis == other
    assert out.samples_s == [TwoClocks.FIGURES[basis]] * 4 and out.other_s == [TwoClocks.FIGURES[other]] * 4
    assert clock.calls == [basis] + [basis, other] * 4  # warm-up on the headline only; then both, headline first
    assert len(out.records) == 4  # what the headline's calls recorded
    # device-time calls whose launch outlasted the flush, timed ones only (not the warm-up)
    # device calls 3 and 5 (device first: call 1 is its warm-up, not counted) or 1 and 3 (wall first)
    assert out.launch_outlasted_flush == 2


def test_the_other_clock_may_be_left_out():
    clock = TwoClocks()
    out = timing.measure_interleaved({"a": lambda _: None}, clock, QUICK, basis="device", other_clock=False)["a"]
    assert out.samples_s == [1e-3] * 4 and out.other_s == [] and clock.calls == ["device"] * 5


def test_the_stopping_rule_reads_the_headline_list_only():
    """The other clock's samples spread widely; the headline's do not: the loop stops at min_reps."""

    class Spread(TwoClocks):
        def time_call(self, fn, basis="device"):
            fn()
            self.calls.append(basis)
            return 1e-3 if basis == "device" else 1e-3 * (1 + len(self.calls))

    policy = timing.Policy(warmup_s=0.0, min_reps=5, max_reps=50, min_time_s=0.0, target_iqr=0.01)
    out = timing.measure_interleaved({"a": lambda _: None}, Spread(), policy, basis="device")["a"]
    assert out.n == 5 and len(out.other_s) == 5


def test_on_a_cpu_there_is_one_clock_recorded_once():
    out = timing.measure_interleaved({"a": lambda _: None}, timing.Clock(CPU), QUICK, basis="device")["a"]
    assert out.basis == "host" and out.n == 4 and out.other_s == []


# -- the technique decides: kernel on device time, a step on wall time --------------------------------
class _NoTelemetry:
    def set_tag(self, case_id, variant):
        pass

    def energy_mj(self):
        return None


def _run(technique, params=None, clock=None):
    case = Case(technique.name, {**technique.defaults(), **(params or {})}, QUICK, 0)
    return runner.run_case(case, CPU, clock or TwoClocks(), _NoTelemetry(), None)


def test_the_shapes_clocks():
    assert SHAPE_TIME_BASIS == {
        "kernel": "device",
        "training_step": "wall",
        "serving_run": "wall",
        "generation_run": "wall",
        "analytic": "wall",
    }


def test_a_kernel_headlines_device_time_and_a_training_step_wall_time(toys):
    kernel, step = _run(toys.KERNEL), _run(toys.TRAIN)
    assert kernel.passed and step.passed
    for record, basis, other in ((kernel, "device", "wall"), (step, "wall", "device")):
        timed = [v for v in record.variants.values() if v.status == "ok"]
        assert len(timed) >= 2
        for v in timed:
            assert v.time_basis == basis and v.basis == basis
            assert v.samples_s == [TwoClocks.FIGURES[basis]] * 4
            assert v.other_samples_s == [TwoClocks.FIGURES[other]] * 4
            assert v.stats["median"] == TwoClocks.FIGURES[basis]  # stats from the headline list
    v = kernel.variants[kernel.role_variant("optimized")]
    assert record_method(kernel) == "cuda_event"  # the headline's: events
    assert record_method(step) == "perf_counter_ns"  # the headline's: the host clock
    assert v.launch_share == pytest.approx(1 / 3)
    assert kernel.phases_s["timed"] == pytest.approx(
        sum(sum(v.samples_s) + sum(v.other_samples_s) for v in kernel.variants.values() if v.samples_s)
    )


def record_method(record):
    return record.variants[record.role_variant("optimized")].timing["method"]


def test_a_plug_in_may_choose_the_other_clock(toys):
    overridden = Technique(
        "toy_kernel_on_wall",
        summary="s",
        shape="kernel",
        params=list(toys.KERNEL.params),
        time_basis="wall",
        build_fn=toys.KERNEL.build_fn,
        variants=toys.KERNEL.variants,
        check_fn=toys.KERNEL.check_fn,
        metrics_fn=toys.KERNEL.metrics_fn,
    )
    from gpubench import techniques

    techniques.register(overridden, "test")
    try:
        record = _run(overridden)
    finally:
        techniques.unregister(overridden.name)
    assert {v.time_basis for v in record.variants.values() if v.status == "ok"} == {"wall"}


def test_time_basis_defaults_to_the_shape_and_refuses_other_names():
    assert Technique("k", summary="s", shape="kernel", params=[]).time_basis == "device"
    assert Technique("g", summary="s", shape="generation_run", params=[]).time_basis == "wall"
    assert Technique("o", summary="s", shape="kernel", params=[], time_basis="wall").time_basis == "wall"
    with pytest.raises(ValueError, match="time_basis must be one of"):
        Technique("x", summary="s", shape="kernel", params=[], time_basis="host")


def test_a_cpu_run_records_one_clock(toys):
    record = _run(toys.KERNEL, clock=timing.Clock(CPU, flush_l2=False))
    for v in [v for v in record.variants.values() if v.status == "ok"]:
        assert v.time_basis == "host" and v.other_samples_s == []
        # one clock: device and wall time are the same list
        assert v.samples_on("device") == v.samples_on("wall") == v.samples_s
        assert v.launch_share == 0.0


# -- records: both lists kept, older files read as before -----------------------------------------------
def test_records_keep_both_lists_through_the_file(toys):
    record = _run(toys.KERNEL)
    back = CaseRecord.from_dict(record.to_dict())
    v = back.variants[back.role_variant("optimized")]
    assert (v.time_basis, v.samples_s, v.other_samples_s) == ("device", [1e-3] * 4, [1.5e-3] * 4)
    assert v.samples_on("wall") == [1.5e-3] * 4 and v.samples_on("device") == [1e-3] * 4


@pytest.mark.parametrize(
    "timing_dict,basis",
    [({"method": "perf_counter_ns"}, "host"), ({"method": "cuda_event"}, "cuda_event_legacy"), (None, "")],
)
def test_an_older_record_reads_as_before_and_says_its_clock(timing_dict, basis):
    v = VariantRecord.from_dict({"role": "optimized", "samples_s": [1.0, 2.0], "timing": timing_dict})
    assert v.samples_s == [1.0, 2.0] and v.other_samples_s == [] and v.time_basis == ""
    assert v.basis == basis and v.other_basis is None
    # A CPU's older record holds its one clock, so no share outside device time (0); others none.
    assert v.launch_share == (0.0 if basis == "host" else None)


# -- the gate: like with like --------------------------------------------------------------------------
def _variant(role, basis, headline, other=None, method=None):
    v = {"role": role, "status": "ok", "samples_s": list(headline)}
    if basis:
        v["time_basis"] = basis
    if other is not None:
        v["other_samples_s"] = list(other)
    if method:
        v["timing"] = {"method": method}
    return v


def _doc(cases):
    return {
        "kind": "gpubench.results",
        "schema_version": 3,
        "run_id": "r",
        "status": "complete",
        "device_label": "GPU",
        "scenario": {"name": "s", "entries": [{"technique": "t"}]},
        "cases": [{"id": cid, "technique": "t", "status": "passed", "variants": v} for cid, v in cases],
    }


FAST = [1.0e-3 + i * 1e-6 for i in range(20)]


def _scaled(samples, factor):
    return [x * factor for x in samples]


def test_the_gate_compares_on_the_clock_both_runs_recorded():
    """The baseline headlined wall time (the optimized variant 2x slower there than on device time);
    the current run headlines device time: compared on device time, the baseline's other list,
    unchanged; on the headline lists it would read as a 2x improvement."""
    base = _doc(
        [
            (
                "a",
                {
                    "baseline": _variant("baseline", "wall", _scaled(FAST, 4), _scaled(FAST, 3)),
                    "optimized": _variant("optimized", "wall", _scaled(FAST, 2), FAST),
                },
            )
        ]
    )
    cur = _doc(
        [
            (
                "a",
                {
                    "baseline": _variant("baseline", "device", _scaled(FAST, 3), _scaled(FAST, 4)),
                    "optimized": _variant("optimized", "device", FAST, _scaled(FAST, 2)),
                },
            )
        ]
    )
    change = compare.compare(base, cur).changes[0]
    assert change.verdict == "unchanged" and change.time_basis == "device"
    assert change.ratio == pytest.approx(1.0) and change.context.ratio == pytest.approx(1.0)
    assert "compared on device time, which the baseline recorded beside its headline (wall time)" in change.reason


def test_the_gate_uses_the_baselines_clock_where_only_the_current_run_recorded_it():
    base = _doc([("a", {"optimized": _variant("optimized", "wall", _scaled(FAST, 2))})])  # no other list
    cur = _doc([("a", {"optimized": _variant("optimized", "device", FAST, _scaled(FAST, 2))})])
    change = compare.compare(base, cur).changes[0]
    assert change.verdict == "unchanged" and change.time_basis == "wall"
    assert "the baseline's headline" in change.reason


def test_the_gate_never_judges_mixed_clocks():
    """An older GPU baseline (events after a host sync) against device time: inconclusive, with
    why; --strict fails on it. Judged on the headlines, it would be a 2x improvement."""
    base = _doc([("a", {"optimized": _variant("optimized", "", _scaled(FAST, 2), method="cuda_event")})])
    cur = _doc([("a", {"optimized": _variant("optimized", "device", FAST, _scaled(FAST, 2))})])
    result = compare.compare(base, cur)
    change = result.changes[0]
    assert change.verdict == "inconclusive" and change.time_basis is None and change.ratio is None
    assert "not judged on mixed clocks" in change.reason and "older CUDA clock" in change.reason
    assert result.passed and not compare.compare(base, cur, strict=True).passed


def test_records_that_say_the_same_clock_or_nothing_compare_as_before():
    older_cpu = _doc([("a", {"optimized": _variant("optimized", "", _scaled(FAST, 2), method="perf_counter_ns")})])
    cpu = _doc([("a", {"optimized": _variant("optimized", "host", FAST)})])
    change = compare.compare(older_cpu, cpu).changes[0]
    assert change.verdict == "improved" and change.time_basis == "host" and change.reason == ""
    unknown = _doc([("a", {"optimized": _variant("optimized", "", _scaled(FAST, 2))})])
    assert compare.compare(unknown, cpu).changes[0].verdict == "improved"


# -- what the terminal and the report say ---------------------------------------------------------------
def _run_record(cases):
    return RunRecord.from_dict(_doc(cases))


def test_the_terminal_says_which_clock_and_the_launch_share_where_material():
    run = _run_record(
        [
            ("a", {"optimized": _variant("optimized", "device", FAST, _scaled(FAST, 2))}),
            ("b", {"optimized": _variant("optimized", "device", FAST, _scaled(FAST, 1.05))}),
        ]
    )
    lines = terminal.clock_lines(run)
    assert lines == [
        "time: t on device time: CUDA events, launch work excluded (launch and syncs are 10% or "
        "more of wall time in 1 of 2 cases, up to 50%: both clocks in the results)"
    ]
    assert terminal.other_clock_text(run.cases[0].variant("optimized")) == "wall 2.02 ms (launch and syncs 50%)"
    assert terminal.other_clock_text(run.cases[1].variant("optimized")) == ""  # 5%: not material
    cpu = _run_record([("a", {"optimized": _variant("optimized", "host", FAST)})])
    assert terminal.clock_lines(cpu) == [
        "time: one clock: perf_counter on the host; on a CPU device and wall time are the same figure"
    ]


def test_the_report_section_names_the_clock_and_shows_the_other():
    run = _run_record([("a", {"optimized": _variant("optimized", "wall", _scaled(FAST, 2), FAST)})])
    note = sections.clock_note(run.cases)
    assert note.startswith("Times here are wall time: host launch and syncs included.")
    assert "(1 variant at 10% or more)" in note
    row = sections.variant_rows(run.cases[0], 1)[0]
    assert row["other_clock"] == "device 1.01 ms (launch and syncs 50%)"
    assert "launch took longer" not in note
    run.cases[0].variants["optimized"].timing = Timing(method="perf_counter_ns", launch_outlasted_flush=3)
    assert sections.clock_note(run.cases).endswith(
        "In 3 of 20 device-time samples the call's launch took longer than the L2 flush ran, so those may hold "
        "some launch work."
    )
    cpu = _run_record([("a", {"optimized": _variant("optimized", "host", FAST)})])
    assert "on a CPU device and wall time are the same figure" in sections.clock_note(cpu.cases)
    assert sections.variant_rows(cpu.cases[0], 1)[0]["other_clock"] == ""


def test_a_report_of_a_two_clock_run_renders(toys, tmp_path):
    from gpubench.reports import html

    record = _run(toys.KERNEL)
    run = RunRecord(
        run_id="r", device="cuda", device_label="GPU", scenario={"name": "s"}, env={}, status="complete", cases=[record]
    )
    page = html.render(html.Run(tmp_path, run, None, None, None))
    assert "device time: CUDA events, launch work excluded" in page
    assert '<dd id="clocks">toy_kernel on device time: CUDA events, launch work excluded (launch and syncs' in page
    assert "wall 1.5 ms (launch and syncs 33%)" in page


# -- benchmarks/do_bench_check.py: the GPU session's check, its logic on a CPU --------------------------
def _do_bench_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "do_bench_check.py"
    spec = importlib.util.spec_from_file_location("benchmarks_do_bench_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_do_bench_check_on_a_cpu_times_nothing_and_says_so(tmp_path, capsys):
    import json

    script = _do_bench_check()
    out = tmp_path / "check.json"
    assert script.main(["--device", "cuda", "--out", str(out)], cuda_available=lambda: False) == 0
    assert "no CUDA device here" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {
        "status": "skipped",
        "reason": "no CUDA device here (torch.cuda.is_available() is False)",
        "cases": [],
    }
    assert script.main(["--device", "cpu"]) == 0 and "is not a GPU" in capsys.readouterr().out


def test_do_bench_check_times_the_harness_on_device_time_not_wall_time():
    out = _do_bench_check().harness_times(lambda: None, TwoClocks(), QUICK)
    assert out == {"device_s": 1e-3, "n": 4, "wall_s": 1.5e-3, "launch_outlasted_flush": 2}


@pytest.mark.parametrize("harness_s,within,code", [(1.04e-3, True, 0), (1.06e-3, False, 1)])
def test_do_bench_check_passes_within_five_percent_only(tmp_path, capsys, harness_s, within, code):
    """Both timers faked: do_bench 1 ms; the harness 4% (passes) or 6% (fails) away; the record
    holds every figure; the two are taken alternately."""
    import json

    script = _do_bench_check()
    order: list[str] = []

    def bench(call):
        order.append("do_bench")
        return 1e-3

    def harness(call):
        order.append("harness")
        return {"device_s": harness_s, "n": 20, "wall_s": 2e-3, "launch_outlasted_flush": 1}

    def check(name, params, device):
        return script.check_case(
            name, params, device, build=lambda *a: ("fake", lambda: None), harness=harness, bench=bench
        )

    out = tmp_path / "check.json"
    code_got = script.main(
        ["--device", "cuda:0", "--out", str(out)],
        check=check,
        cuda_available=lambda: True,
        device_name=lambda d: "Fake GPU",
    )
    assert code_got == code
    record = json.loads(out.read_text())
    assert [c["case"] for c in record["cases"]] == ["flash_attention", "paged_attention"]
    assert all(c["within"] is within and c["ratio"] == pytest.approx(harness_s / 1e-3) for c in record["cases"])
    assert record["status"] == ("passed" if within else "failed") and record["device"] == "Fake GPU"
    assert order == ["do_bench", "harness"] * script.ROUNDS * 2
    printed = capsys.readouterr().out
    assert "harness wall 2000.0 us; launch outlasted the flush in 2 of 40 harness samples" in printed and (
        "NOT within" in printed
    ) is (not within)


def test_the_reports_side_by_side_lists_a_case_on_mixed_clocks_as_inconclusive():
    """An inconclusive case (here: mixed clocks) has its place in the report's comparison (it
    raised ValueError there before), and the medians shown are the ones compared."""
    from gpubench.reports import html

    older = RunRecord.from_dict(
        _doc([("a", {"optimized": _variant("optimized", "", _scaled(FAST, 2), method="cuda_event")})])
    )
    now = RunRecord.from_dict(_doc([("a", {"optimized": _variant("optimized", "device", FAST, _scaled(FAST, 2))})]))
    row = html.compare_runs(now, older)["rows"][0]
    assert row["class"] == "inconclusive" and "not judged on mixed clocks" in row["note"]
    wall_base = RunRecord.from_dict(
        _doc([("a", {"optimized": _variant("optimized", "wall", _scaled(FAST, 2), _scaled(FAST, 1.5))})])
    )
    row = html.compare_runs(now, wall_base)["rows"][0]  # compared on device time: 1.5x the samples before
    assert row["class"] == "improved" and (row["before"], row["after"]) == ("1.51 ms", "1.01 ms")
