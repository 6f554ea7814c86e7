"""Results files: atomic writes, valid JSON, clear errors for missing or corrupt files."""
import json
import os

import pytest

from gpubench import atomic, results
from gpubench.errors import BadInput


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
    assert results.json_safe({"a": float("inf"), "b": [1.0, float("nan")], "c": (1, 2)}) == {"a": None, "b": [1.0, None], "c": [1, 2]}


def _doc(**over):
    return {"kind": "gpubench.results", "schema_version": results.SCHEMA_VERSION, "cases": [], **over}


@pytest.mark.parametrize("content,expected", [
    (None, "no such file"),
    ('{"kind": "gpubench.results", "schema_ver', "not a readable results file"),
    ('{"hello": 1}', "not a gpubench results file"),
    (json.dumps(_doc(schema_version=99)), "schema_version is 99"),
])
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
    doc = _doc(run_id="r", cases=[{
        "id": "t[n=1]", "technique": "t", "status": "passed", "params": {"n": 1}, "speedups": {"o": {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1}},
        "variants": {"b": {"role": "baseline", "status": "ok", "stats": {"n": 3, "median": 0.002}, "metrics": {}},
                     "o": {"role": "optimized", "status": "ok", "stats": {"n": 3, "median": 0.001}, "metrics": {"tflops": 1.5}}}}])
    frame = results.cases_frame(doc)
    assert list(frame["variant"]) == ["b", "o"]
    assert frame.loc[1, "median_ms"] == pytest.approx(1.0) and frame.loc[1, "speedup"] == 2.0
    assert frame.loc[1, "m_tflops"] == 1.5 and frame.loc[0, "p_n"] == 1


def _old_case(n_base, n_opt):
    """A case as gpubench before issue 34 wrote it: at n=1 an interval of no width (the median twice)."""
    base, opt = "baseline", "optimized"

    def variant(role, samples):
        med = sorted(samples)[len(samples) // 2]
        return {"role": role, "status": "ok", "samples_s": samples,
                "stats": {"n": len(samples), "median": med, "ci_low": med if len(samples) == 1 else med * 0.9,
                          "ci_high": med if len(samples) == 1 else med * 1.1}}

    return {"id": "t[x=1]", "technique": "t", "params": {"x": 1}, "seed": 0, "policy": {}, "status": "passed",
            "variants": {base: variant("baseline", [0.37] * n_base), opt: variant("optimized", [1.0] * n_opt)},
            "speedups": {opt: {"ratio": 0.37, "ci_low": 0.37, "ci_high": 0.37}}}


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
