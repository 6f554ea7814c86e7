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
