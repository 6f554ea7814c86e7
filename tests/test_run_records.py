"""A run is a self-describing record (issue 26): results.json carries its techniques' declarations,
so the report draws and judges it without their code; it is read back into the dataclasses that
wrote it; a file of another schema version is bad input naming the versions this gpubench reads."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from html import escape
from pathlib import Path

import pytest

from gpubench import techniques
from gpubench.errors import BadInput
from gpubench.measure.energy import EnergyMeasurement
from gpubench.records import results
from gpubench.records.declarations import TechniqueRecord
from gpubench.records.results import CaseRecord, Failure, RunRecord, Speedup, Stats, TimeUse, VariantRecord

ROOT = Path(__file__).resolve().parent.parent

# A plug-in pair whose every declaration the report shows: a param's help, a headline figure, a
# declared plot and a claim read exactly (bytes moved is bookkeeping: any device gives a verdict).
PAIR = '''
import torch
from gpubench.records.claims import Claim
from gpubench.contract import CheckResult, Headline, Param, Plot, Technique, Workload

TECHNIQUE = Technique(
    "vanishing_pair", summary="a pair whose module is deleted after its run", shape="kernel",
    anchor="the vanishing anchor figure",
    params=[Param("rows", int, 64, "rows of the vanishing matrix", min=1), Param("hidden", int, 64, "its width")],
    headline_figures=[Headline("bytes_moved", "vanishing bytes")],
    plots=[Plot("vanishing rows per second", y="rows_per_s", x="rows", ylabel="rows/s")],
    claims=[Claim("Vanishing et al.", "https://example.org/vanishing", "moves 2 x rows x hidden x 4 bytes",
                  figure=(32768.0, 32768.0), unit="fraction", reads="bytes_moved", device_type="",
                  when={"rows": ("==", 64)})],
)


@TECHNIQUE.build
def build(params, device, seed):
    g = torch.Generator().manual_seed(seed)
    return Workload(params, device, seed, {"x": torch.randn(params["rows"], params["hidden"], generator=g)})


@TECHNIQUE.variant("loop", role="baseline")
def loop(w):
    return torch.stack([row * 2 for row in w.x])


@TECHNIQUE.variant("vector", role="optimized")
def vector(w):
    return w.x * 2


@TECHNIQUE.check
def check(reference, output):
    error = float((output - reference).abs().max())
    return CheckResult(error == 0, error, None, "max_abs")


@TECHNIQUE.metrics
def metrics(w, measured):
    return {"bytes_moved": 2 * w.x.numel() * 4, "rows_per_s": w.x.shape[0] / measured.median_s}
'''

SCENARIO = """\
name: vanishing
policy: {warmup_s: 0, min_reps: 3, max_reps: 5, min_time_s: 0, max_time_s: 0.3, energy_s: 0}
entries:
  - technique: vanishing_pair.py
    params: {rows: [64, 128], hidden: 64}
"""


@pytest.fixture(scope="module")
def vanished_run(tmp_path_factory) -> Path:
    """A real run of the plug-in pair (in this process, isolation none, as `gpubench run
    --no-calibrate --isolation none` runs it), then the pair forgotten as if it had run in another
    process: unregistered, its modules dropped from sys.modules, its file deleted."""
    from inprocess import run_in_process

    from gpubench import techniques
    from gpubench.run import scenario

    work = tmp_path_factory.mktemp("vanishing")
    (work / "vanishing_pair.py").write_text(PAIR)
    (work / "s.yaml").write_text(SCENARIO)
    loaded = set(sys.modules)
    try:
        with pytest.MonkeyPatch.context() as env:  # tunings and case times in a cache of the run's own
            env.setenv("GPUBENCH_CACHE_DIR", str(work / "cache"))
            outcome = run_in_process(scenario.load(str(work / "s.yaml")), "cpu", work / "runs", calibrate=False)
    finally:
        techniques.unregister("vanishing_pair")
        for name in set(sys.modules) - loaded:
            if name.startswith("gpubench_user_"):  # the plug-in file's module and its folder's package
                del sys.modules[name]
    assert outcome.exit_code == 0 and outcome.doc["summary"]["failed"] == 0, outcome.doc["summary"]
    (work / "vanishing_pair.py").unlink()
    assert techniques.get("vanishing_pair") is None and not [m for m in sys.modules if "vanishing" in m]
    return outcome.run_dir


def test_a_run_renders_its_headline_figures_claims_and_param_help_after_its_module_is_gone(vanished_run, monkeypatch):
    from gpubench import techniques
    from gpubench.reports import html

    def no_code(*args, **kwargs):
        raise AssertionError("the report of a version-3 run looked up technique code")

    monkeypatch.setattr(techniques, "find", no_code)
    monkeypatch.setattr(techniques, "all_techniques", no_code)
    page = html.write_report(vanished_run).html.read_text(encoding="utf-8")
    assert "a pair whose module is deleted after its run" in page and "the vanishing anchor figure" in page
    # the headline figure it declared (its arrow one unbreakable piece)
    assert 'vanishing bytes 32,768–65,536 <span class="nw">-&gt;</span> 32,768–65,536' in page
    assert '<figcaption>vanishing rows per second</figcaption>' in page and 'id="data-' in page  # declared plot
    table = page.split('<table id="claims-table">')[1].split("</table>")[0]
    assert "moves 2 x rows x hidden x 4 bytes" in table and ">holds<" in table  # judged by the claim of its day
    assert "rows of the vanishing matrix" in page and escape("int >= 1") in page  # param help, as declared
    assert "does not know it" not in page


def test_the_run_records_its_techniques_declarations_and_the_claims_of_those_it_left_out(vanished_run):
    doc = json.loads((vanished_run / "results.json").read_text())
    assert doc["schema_version"] == results.SCHEMA_VERSION == 3
    declared = doc["techniques"]["vanishing_pair"]
    assert declared["headline_figures"][0]["metric"] == "bytes_moved"
    assert declared["plots"][0]["title"] == "vanishing rows per second"
    assert declared["claims"][0]["when"] == {"rows": ["==", 64]}
    assert {p["name"]: p["help"] for p in declared["params"]}["rows"] == "rows of the vanishing matrix"
    assert "vanishing_pair" not in doc["claims_elsewhere"] and doc["claims_elsewhere"]["kv_cache"]
    run = results.load_run(vanished_run)
    assert run.technique("vanishing_pair") == TechniqueRecord.from_dict(declared)
    assert run.technique("vanishing_pair").claims[0].when == {"rows": ("==", 64)}


def test_no_report_module_imports_the_technique_registry():
    """The report reads only the run: no module of reports/ imports gpubench.techniques (the
    registry's code reaches it only through gpubench.records.declarations, for old runs and figure hooks)."""
    offenders = []
    for path in sorted((ROOT / "reports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("gpubench.techniques")]
    assert not offenders, offenders


def _record() -> RunRecord:
    energy = EnergyMeasurement(0.5, 0.01, 120.0, 700.0, 0.4, 80, 5, 0.1)
    variants = {
        "eager": VariantRecord(
            "baseline",
            "eager",
            "ok",
            samples_s=[1e-3, 2e-3],
            stats=Stats(median=1.5e-3),
            metrics={"flops": 10.0},
            recorded=[{"syncs": 3}],
            energy=energy,
        ),
        "fused": VariantRecord(
            "optimized", "fused", "error", reason="boom", error=Failure("exception", "boom", "trace")
        ),
    }
    case = CaseRecord(
        "t[n=1]",
        "t",
        {"n": 1},
        7,
        {"min_reps": 3},
        status="failed",
        failure=Failure("variant", "fused: boom"),
        variants=variants,
        speedups={"fused": Speedup(1.5, 1.4, 1.6)},
        phases_s={"build": 0.1},
    )
    return RunRecord(
        "r",
        "cpu",
        "CPU: test",
        {"name": "s", "entries": []},
        {"python": "3"},
        status="complete",
        cases=[case],
        crash=Failure("crash", "x"),
        time_use=TimeUse(2.0, 1, 1.0, {"timed": 0.5}, 0.25),
    )


def test_a_run_is_read_back_into_the_dataclasses_that_wrote_it(tmp_path):
    record = _record()
    directory = results.RunDirectory(tmp_path)
    directory.write_results(record)
    back = results.load_run(tmp_path)
    assert back == record  # every record typed again: Failure, EnergyMeasurement, TimeUse, VariantRecord
    assert isinstance(back.cases[0].variants["eager"].energy, EnergyMeasurement)
    assert back.cases[0].variants["fused"].error == Failure("exception", "boom", "trace")


def test_keys_of_a_newer_minor_version_are_ignored_never_a_crash(tmp_path):
    doc = _record().to_dict()
    doc["from_the_future"] = 1
    doc["cases"][0]["from_the_future"] = {"a": 1}
    doc["cases"][0]["variants"]["eager"]["from_the_future"] = [1]
    doc["cases"][0]["variants"]["eager"]["energy"]["from_the_future"] = 2
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert results.load_run(tmp_path) == _record()


@pytest.mark.parametrize("version", [0, 4, "3", None])
def test_a_file_of_another_schema_version_is_bad_input_naming_it_and_the_readable_ones(tmp_path, version):
    doc = {**_record().to_dict(), "schema_version": version}
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(BadInput) as info:
        results.load_run(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "results.json") in message and f"schema_version is {version!r}" in message
    assert "reads versions 1, 2, 3" in message


def test_a_version_1_run_is_upgraded_on_read():
    """Version 1 named variants by role; a record without ``role`` takes its name's."""
    old = {
        "kind": "gpubench.results",
        "schema_version": 1,
        "cases": [
            {
                "id": "t[]",
                "technique": "t",
                "status": "passed",
                "variants": {"baseline": {}, "optimized": {"role": "optimized"}},
            }
        ],
    }
    run = RunRecord.from_dict(old)
    assert run.cases[0].role_variant("baseline") == "baseline" and not run.recorded_declarations
    assert dataclasses.asdict(run.cases[0].variants["baseline"])["role"] == "baseline"


def test_a_record_reaches_technique_code_only_through_the_registry_its_caller_passed():
    """No back door: without a registry a record (and a report reading it) runs no technique code;
    an old run's declarations and a figure hook come only from the registry the caller gave."""
    from gpubench.records.declarations import figures_hook

    asked = []

    class Registry:
        def find(self, name, source=""):
            asked.append(name)
            return techniques.find(name, source)

        def all_techniques(self):
            return techniques.all_techniques()

    old = {
        "kind": "gpubench.results",
        "schema_version": 2,
        "cases": [{"id": "kv_cache[]", "technique": "kv_cache", "status": "passed", "variants": {}}],
    }
    alone = RunRecord.from_dict(old)
    assert alone.technique("kv_cache") is None and alone.claims_elsewhere() == {} and asked == []
    given = RunRecord.from_dict(old, Registry())
    assert given.technique("kv_cache").name == "kv_cache" and asked == ["kv_cache"]
    hook = TechniqueRecord("kv_cache", figures_hook=True)
    assert figures_hook(hook) == (
        None,
        "no technique registry was given to the report (a figure function is code, not data)",
    )


def test_a_typed_figure_still_reads_as_the_dict_it_was():
    """Scripts written against results' dicts: get() gives its default for a key the file left out
    (a typed field absent is not None), and keys(), items(), iteration and ** see the file's keys."""
    from gpubench.records.results import Stats, Timing

    timing = Timing.from_dict({"method": "interleaved", "rounds": 3})
    assert timing.get("cuda_graph", "off") == "off" and "cuda_graph" not in timing
    assert timing.get("rounds") == 3 and timing["method"] == "interleaved"
    stats = Stats.from_dict({"median": 1.5, "n": 7, "made_up": "kept"})
    assert list(stats.keys()) == ["median", "n", "made_up"] == list(stats)
    assert {**stats} == dict(stats.items()) == {"median": 1.5, "n": 7, "made_up": "kept"}
