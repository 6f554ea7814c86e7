"""Several device models: the report's technique x device matrix and the gate, model by model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from gpubench.cli import main
from gpubench.gate import compare
from gpubench.reports import html

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _case(case_id: str, device: str | None, base: list[float], scale: float) -> dict:
    return {
        "id": case_id,
        "technique": "t",
        "params": {"n": case_id},
        "status": "passed",
        "failure": None,
        "device": None if device is None else {"label": device},
        "variants": {
            "eager": {"role": "baseline", "samples_s": base, "stats": {"median": float(np.median(base))}},
            "triton": {
                "role": "optimized",
                "samples_s": [x * scale for x in base],
                "stats": {"median": float(np.median(base)) * scale},
            },
        },
        "speedups": {"triton": {"ratio": 1 / scale, "ci_low": 0.95 / scale, "ci_high": 1.05 / scale}},
    }


def _run(tmp_path, name: str, cases: list[dict], label: str) -> str:
    doc = {
        "kind": "gpubench.results",
        "schema_version": 2,
        "run_id": name,
        "status": "complete",
        "device": "cuda",
        "device_label": label,
        "scenario": {"name": "s", "entries": [{"technique": "t"}]},
        "cases": cases,
        "summary": {"cases": len(cases), "passed": len(cases), "failed": 0},
    }
    path = tmp_path / name
    path.mkdir()
    (path / "results.json").write_text(json.dumps(doc))
    return str(path)


SAMPLES = list(np.random.default_rng(0).normal(1e-3, 1e-6, 30))


def test_a_run_over_two_device_models_reports_a_matrix_with_a_cell_per_case_and_model(tmp_path):
    cases = [
        _case("a", H100, SAMPLES, 0.5),
        _case("a", H200, SAMPLES, 0.25),
        _case("b", H100, SAMPLES, 2.0),
        _case("b", H200, SAMPLES, 1.0),
    ]
    run = html.load_run(_run(tmp_path, "mixed", cases, f"{H100} + {H200}"))
    matrix = html.fleet_matrix([run.record])
    assert matrix["columns"] == [H100, H200]
    cells = {r["label"].split()[-1]: [c["text"] for c in r["cells"]] for r in matrix["rows"]}
    assert cells == {
        "n=a": ["2.00x [1.90, 2.10]", "4.00x [3.80, 4.20]"],
        "n=b": ["0.50x [0.47, 0.53]", "1.00x [0.95, 1.05]"],
    }
    assert [c["class"] for c in matrix["rows"][1]["cells"]] == ["slower", ""]  # only where the CI says so
    page = html.render(run)
    assert 'id="fleet-table"' in page and "<th>device</th>" in page


def test_several_runs_give_one_matrix_and_one_model_gives_none(tmp_path):
    one = _run(tmp_path, "h100", [_case("a", None, SAMPLES, 0.5)], H100)
    two = _run(tmp_path, "h200", [_case("a", None, SAMPLES, 0.25)], H200)
    three = _run(tmp_path, "h100b", [_case("a", None, SAMPLES, 0.5)], H100)
    assert html.fleet_matrix([html.load_run(one).record]) is None
    result = CliRunner().invoke(main, ["report", one, "--compare", two, three])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "h100" / "report.html").read_text()
    assert 'id="fleet-table"' in page and f"<th>{H200}</th>" in page
    assert page.count("<tr><td><a href=\"#tech-t\">") == 1  # one row per case, a column per model


def test_the_gate_compares_each_device_model_with_its_own_baseline(tmp_path):
    cases = [_case("a", H100, SAMPLES, 0.5), _case("a", H200, SAMPLES, 0.5)]
    base_dir = _run(tmp_path, "base", cases, f"{H100} + {H200}")
    store = tmp_path / "store"
    saved = CliRunner().invoke(main, ["baseline", "save", base_dir, "--baseline-dir", str(store)])
    assert saved.exit_code == 0, saved.output
    assert sorted(p.parent.name for p in store.glob("*/s.json")) == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"]
    slower = copy.deepcopy(cases)
    slower[1]["variants"]["triton"]["samples_s"] = [x * 0.5 * 1.5 for x in SAMPLES]  # H200 only, 50% slower
    current = _run(tmp_path, "current", slower, f"{H100} + {H200}")
    result = CliRunner().invoke(main, ["compare", "--baseline-store", str(store), current, "--json"])
    assert result.exit_code == 1, result.output
    changes = {(c["case_id"], c["device"]): c["verdict"] for c in json.loads(result.output)["changes"]}
    assert changes == {("a", H100): "unchanged", ("a", H200): "regressed"}


def test_runs_on_hardware_that_shares_no_model_are_refused_unless_forced(tmp_path):
    base = json.loads(Path(f"{_run(tmp_path, 'b', [_case('a', None, SAMPLES, 1)], H100)}/results.json").read_text())
    cur = json.loads(Path(f"{_run(tmp_path, 'c', [_case('a', None, SAMPLES, 1)], H200)}/results.json").read_text())
    try:
        compare.compare(base, cur)
    except compare.BadInput as exc:
        assert "different hardware" in str(exc)
    else:
        raise AssertionError("compared an H100 run with an H200 run without --force")
    assert compare.compare(base, cur, force=True).changes[0].verdict == "unchanged"
