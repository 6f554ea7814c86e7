"""Results files: atomic writes, valid JSON, clear errors for missing or corrupt files."""

import json
import os

import pytest

from gpubench.errors import BadInput
from gpubench.records import atomic, results


def test_a_crash_during_a_write_leaves_the_last_complete_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    atomic.atomic_write_json(target, {"cases": [1]})

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError):
        atomic.atomic_write_json(target, {"cases": [1, 2]})
    assert json.loads(target.read_text()) == {"cases": [1]}
    assert os.listdir(tmp_path) == ["results.json"]  # no temporary file left behind


def test_an_unserialisable_document_never_truncates_the_file(tmp_path):
    target = tmp_path / "results.json"
    atomic.atomic_write_json(target, {"ok": 1})
    with pytest.raises(ValueError):
        atomic.atomic_write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": 1}


def test_non_finite_figures_become_null():
    assert results.json_safe({"a": float("inf"), "b": [1.0, float("nan")], "c": (1, 2)}) == {
        "a": None,
        "b": [1.0, None],
        "c": [1, 2],
    }


def _doc(**over):
    return {"kind": "gpubench.results", "schema_version": results.SCHEMA_VERSION, "cases": [], **over}


@pytest.mark.parametrize(
    "content,expected",
    [
        (None, "no such file"),
        ('{"kind": "gpubench.results", "schema_ver', "not a readable results file"),
        ('{"hello": 1}', "not a gpubench results file"),
        (json.dumps(_doc(schema_version=99)), "schema_version is 99"),
    ],
)
def test_missing_or_corrupt_results_are_bad_input_naming_the_file(tmp_path, content, expected):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BadInput) as info:
        results.load_results(path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_load_accepts_a_run_directory(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_doc()))
    assert results.load_results(tmp_path)["cases"] == []


def test_csv_has_one_row_per_case_and_variant():
    doc = _doc(
        run_id="r",
        cases=[
            {
                "id": "t[n=1]",
                "technique": "t",
                "status": "passed",
                "params": {"n": 1},
                "speedups": {"o": {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1}},
                "variants": {
                    "b": {"role": "baseline", "status": "ok", "stats": {"n": 3, "median": 0.002}, "metrics": {}},
                    "o": {
                        "role": "optimized",
                        "status": "ok",
                        "stats": {"n": 3, "median": 0.001},
                        "metrics": {"tflops": 1.5},
                    },
                },
            }
        ],
    )
    frame = results.cases_frame(doc)
    assert list(frame["variant"]) == ["b", "o"]
    assert frame.loc[1, "median_ms"] == pytest.approx(1.0) and frame.loc[1, "speedup"] == 2.0
    assert frame.loc[1, "m_tflops"] == 1.5 and frame.loc[0, "p_n"] == 1


def _old_case(n_base, n_opt):
    """A case as gpubench before issue 34 wrote it: at n=1 an interval of no width (the median twice)."""
    base, opt = "baseline", "optimized"

    def variant(role, samples):
        med = sorted(samples)[len(samples) // 2]
        return {
            "role": role,
            "status": "ok",
            "samples_s": samples,
            "stats": {
                "n": len(samples),
                "median": med,
                "ci_low": med if len(samples) == 1 else med * 0.9,
                "ci_high": med if len(samples) == 1 else med * 1.1,
            },
        }

    return {
        "id": "t[x=1]",
        "technique": "t",
        "params": {"x": 1},
        "seed": 0,
        "policy": {},
        "status": "passed",
        "variants": {base: variant("baseline", [0.37] * n_base), opt: variant("optimized", [1.0] * n_opt)},
        "speedups": {opt: {"ratio": 0.37, "ci_low": 0.37, "ci_high": 0.37}},
    }


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_file_with_an_interval_from_one_sample_is_read_as_having_none(tmp_path, version):
    """Issue 34: files written before the fix hold 0.37x [0.37, 0.37] from one timed call a variant.
    Read back, the interval is gone (stats and speedup), the count is there, the ratio stays."""
    (tmp_path / "results.json").write_text(json.dumps(_doc(schema_version=version, cases=[_old_case(1, 1)])))
    case = results.load_run(tmp_path).cases[0]
    opt = case.role_variant("optimized")
    speedup = case.speedup(opt)
    assert speedup is not None and speedup["ratio"] == 0.37 and speedup["n"] == 1
    assert speedup["ci_low"] is None and speedup["ci_high"] is None and not results.has_interval(speedup)
    assert case.variants[opt].stats["ci_low"] is None and case.variants[opt].median_s == 1.0


def test_an_older_speedup_counts_the_fewer_samples_of_its_two_variants(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_doc(cases=[_old_case(30, 3)])))
    case = results.load_run(tmp_path).cases[0]
    assert case.speedup("optimized")["n"] == 3 and not results.has_interval(case.speedup("optimized"))
    assert results.has_interval(case.variants["baseline"].stats)  # 30 samples: its own CI stands


def test_an_older_file_with_enough_samples_keeps_its_intervals(tmp_path):
    doc = _doc(cases=[_old_case(10, 10)])
    doc["cases"][0]["speedups"]["optimized"].update(ci_low=0.35, ci_high=0.39)
    (tmp_path / "results.json").write_text(json.dumps(doc))
    speedup = results.load_run(tmp_path).cases[0].speedup("optimized")
    assert (speedup["ci_low"], speedup["ci_high"], speedup["n"]) == (0.35, 0.39, 10)


# -- the typed figures: one from_dict / to_dict, the file's schema unchanged ---------------------
from gpubench.records.results import Check, Device, Profile, Speedup, Stats, Telemetry, Timing, TopOp, VariantTelemetry  # noqa: E402


@pytest.mark.parametrize(
    "built, written",
    [
        # what each writer wrote as a dict before the records were typed, key for key and in order
        (Timing(method="none", not_timed="checked only"), {"method": "none", "not_timed": "checked only"}),
        (
            Timing(method="cuda_event", l2_flush=True, cuda_graph="off"),
            {"method": "cuda_event", "l2_flush": True, "cuda_graph": "off"},
        ),
        (
            Timing(
                method="cuda_event", l2_flush=True, cuda_graph="on", launch_outlasted_flush=3, both_clocks_one_call=2
            ),
            {
                "method": "cuda_event",
                "l2_flush": True,
                "cuda_graph": "on",
                "launch_outlasted_flush": 3,
                "both_clocks_one_call": 2,
            },
        ),
        (
            Check(True, 0.0, None, "reference", "the baseline is the reference"),
            {
                "passed": True,
                "error": 0.0,
                "tolerance": None,
                "metric": "reference",
                "detail": "the baseline is the reference",
            },
        ),
        (Speedup(1.5, None, None, 2), {"ratio": 1.5, "ci_low": None, "ci_high": None, "n": 2}),
        (Speedup.failed("zero median"), {"ratio": None, "ci_low": None, "ci_high": None, "error": "zero median"}),
        (Profile.failed("RuntimeError: no"), {"error": "RuntimeError: no"}),
        (
            Device("cpu", "cpu", None, "CPU: x"),
            {
                "key": "cpu",
                "type": "cpu",
                "index": None,
                "label": "CPU: x",
                "uuid": None,
                "cpu_affinity": None,
                "host": "",
            },
        ),
        (
            Telemetry(n_samples=0, variants={"a": VariantTelemetry(n_samples=1, throttled=False)}),
            {
                **{
                    k: None
                    for k in (
                        "n_samples",
                        "duration_s",
                        "power_w_mean",
                        "power_w_max",
                        "energy_j_sampled",
                        "temp_c_max",
                        "sm_clock_mhz_min",
                        "sm_clock_mhz_mean",
                        "mem_clock_mhz_min",
                        "mem_used_mb_max",
                        "util_gpu_pct_mean",
                        "throttled",
                        "throttled_fraction",
                    )
                },
                "n_samples": 0,
                "throttle_reasons": [],
                "benign_reasons": [],
                "variants": {
                    "a": {
                        "n_samples": 1,
                        "power_w_mean": None,
                        "power_w_max": None,
                        "sm_clock_mhz_mean": None,
                        "temp_c_max": None,
                        "throttled": False,
                        "throttle_reasons": [],
                    }
                },
            },
        ),
    ],
)
def test_a_typed_figure_writes_what_the_writer_wrote_as_a_dict(built, written):
    """The results schema is unchanged: each typed figure gives the keys, order and values the
    writer's dict gave, and reads back equal."""
    assert json.dumps(built.to_dict()) == json.dumps(written)
    assert type(built).from_dict(written) == built


def test_a_figure_read_and_written_again_is_the_same_document():
    """Keys a figure does not name (a newer minor version's, an open dict's) are kept in
    ``extra``, and a figure read from a file writes back the keys it was read with, in order:
    an older or newer file is never rewritten into another shape."""
    old = {"median": 0.5, "n": 3, "from_a_newer_gpubench": [1, 2]}  # pytest-benchmark-like: median and n only
    stats = Stats.from_dict(old)
    assert stats.median == 0.5 and stats.n == 3 and stats.extra == {"from_a_newer_gpubench": [1, 2]}
    assert json.dumps(stats.to_dict()) == json.dumps(old)
    profile = {
        "calls": 2,
        "top_ops": [{"name": "aten::mm", "share": 0.9, "self_us_per_call": 3.0, "count_per_call": 1, "new": True}],
        "trace": "t.json.gz",
        "notes": [],
    }
    read = Profile.from_dict(profile)
    assert (
        isinstance(read.top_ops[0], TopOp) and read.top_ops[0].share == 0.9 and read.top_ops[0].extra == {"new": True}
    )
    assert json.dumps(read.to_dict()) == json.dumps(profile)
    read.ops_per_call = 4  # set after reading: added after the keys it was read with
    assert list(read.to_dict()) == [*profile, "ops_per_call"]


def test_a_real_run_read_back_writes_the_same_bytes(small_run_dir):
    """results.json of a real run, read into the typed records and written again, is byte for
    byte the file: the types hold every key, in its order."""
    written = (small_run_dir / "results.json").read_text(encoding="utf-8")
    run = results.load_run(small_run_dir)
    assert "".join(run.json_chunks()) == written
    case = run.cases[0]
    variant = case.variants[case.role_variant("baseline")]
    assert isinstance(variant.stats, Stats) and isinstance(variant.check, Check) and isinstance(variant.timing, Timing)
    assert isinstance(case.device, Device) and all(isinstance(s, Speedup) for s in case.speedups.values())


def test_the_run_telemetry_summary_writes_what_the_sampler_wrote_and_reads_by_field():
    """The run-level telemetry (RunTelemetry) is the sampler's summary, key for key and in order,
    with the per-device summaries of a run over several GPUs added last as before; readers get
    fields (status, reason, throttled, ...), and a CPU run's "unavailable" reads back as such."""
    from gpubench.measure.telemetry import TelemetrySampler
    from gpubench.records.results import RunTelemetry

    sampled = {
        "status": "ok",
        "reason": None,
        "interval_s": 0.05,
        "read_errors": 0,
        "last_read_error": None,
        "skipped_ticks": 1,
        "n_samples": 40,
        "power_w_mean": 512.5,
        "throttled": True,
        "throttle_reasons": ["sw_thermal"],
        "a_key_of_a_newer_sampler": 3,
        "device": {"name": "NVIDIA H200"},
    }
    one = RunTelemetry.from_dict(sampled)
    one.devices = {"cuda:0": RunTelemetry.from_dict(sampled), "cuda:1": RunTelemetry.from_dict(sampled)}
    expected = {**sampled, "devices": {"cuda:0": sampled, "cuda:1": sampled}}
    assert json.dumps(one.to_dict()) == json.dumps(expected)
    read = RunTelemetry.from_dict(expected)
    assert read.available and read.throttled and read.throttle_reasons == ["sw_thermal"]
    assert read.devices["cuda:1"].power_w_mean == 512.5 and read.extra == {"a_key_of_a_newer_sampler": 3}
    cpu = TelemetrySampler(None, unavailable_reason="device is cpu (NVML reports NVIDIA GPUs only)").run_summary()
    unavailable = RunTelemetry.from_dict(cpu)
    assert not unavailable.available and unavailable.reason and unavailable.to_dict() == cpu


def test_run_telemetry_of_an_odd_shape_reads_as_far_as_it_is_valid():
    """A hand-edited results.json whose run-level telemetry holds a list or a string where a
    mapping belongs (devices, variants) or nulls where lists belong reads without an error: the
    report and the gate show what they can."""
    from gpubench.records.results import RunTelemetry

    for odd in (
        {"status": "ok", "devices": [{"status": "ok"}]},
        {"status": "ok", "devices": "cuda:0"},
        {"status": "ok", "variants": [1]},
        {"status": "ok", "devices": None, "throttle_reasons": None, "unsupported_fields": None},
    ):
        read = RunTelemetry.from_dict(odd)
        assert read.available and read.devices == {} and read.variants == {} and read.throttle_reasons == []
        assert json.dumps(read.to_dict())  # writes back without an error
