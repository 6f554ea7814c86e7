"""What the command line prints: a log-friendly summary, notices from inside a worker, a gate hint
that leads to a command that works, exit codes a closed pipe cannot change, a dry run that builds
nothing, and error messages the docs quote as the tool prints them."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

from gpubench.cli import main
from gpubench.cli import run as cli_run
from gpubench.records.results import duration_text
from gpubench.reports.gate import case_labels
from gpubench.reports.terminal import case_params, print_summary
from gpubench.run import scenario as scenariomod

ROOT = Path(__file__).resolve().parents[1]
BOX = set("│┃━─┏┓┗┛┡┩╇╋┼")


def _note_pair() -> str:
    """benchmarks/tiny_pair.py as a plug-in named note_pair whose build says something, as the
    speculative pair does before it trains its draft model: the notice must reach the user from a
    worker process."""
    text = (ROOT / "benchmarks" / "tiny_pair.py").read_text()
    edits = {
        '\n    "tiny_pair",\n': '\n    "note_pair",\n',  # TECHNIQUE = Technique(\n    "tiny_pair", ...
        "\n    return Workload(": "\n    notice(f\"note_pair: building case {params['i']} "
        "(a slow step, said out loud)\")\n    return Workload(",
        "\nimport torch\n": "\nimport torch\n\nfrom gpubench.records.notices import notice\n",
    }
    for old, new in edits.items():
        assert text.count(old) == 1, f"benchmarks/tiny_pair.py changed: {old!r} is not there once"
        text = text.replace(old, new)
    return text


FAST = """policy: {warmup_s: 0.0, min_reps: 3, max_reps: 5, min_time_s: 0.0, max_time_s: 0.5, target_iqr: 1.0,
         case_timeout_s: 60, energy_s: 0}
"""


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def note_pair_file(tmp_path_factory):
    """One file for the module: a technique's name may be registered from one source only."""
    from gpubench import techniques

    path = tmp_path_factory.mktemp("plugin") / "note_pair.py"
    path.write_text(_note_pair())
    yield path
    techniques.unregister("note_pair")


@pytest.fixture
def note_scenario(tmp_path, note_pair_file):
    def write(cases: int, name: str = "notes") -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"name: {name}\n{FAST}entries:\n  - technique: {note_pair_file}\n    params: {{i: {list(range(cases))}}}\n"
        )
        return path

    return write


# -- the end-of-run summary -------------------------------------------------------------------------


def _variant(role, name_median, check=None):
    return {
        "role": role,
        "status": "ok",
        "stats": {"median": name_median},
        "check": check or {"passed": True, "error": 0.0, "metric": "reference"},
    }


def _results_doc(n_cases: int = 6) -> dict:
    cases = []
    for i in range(n_cases):
        failed = i == n_cases - 1
        cases.append(
            {
                "id": f"pair[seq_len={128 * (i + 1)},heads=8,kv_heads=0]",
                "technique": "pair",
                "params": {"seq_len": 128 * (i + 1), "heads": 8, "kv_heads": 0},
                "status": "failed" if failed else "passed",
                "failure": {"message": "optimized fast: check failed (max_abs 0.5 > tolerance 0.001)"}
                if failed
                else None,
                "speedups": {"fast": {"ratio": 2.0 + i, "ci_low": 1.9 + i, "ci_high": 2.1 + i}},
                "variants": {
                    "slow": _variant("baseline", 1e-3 * (i + 1)),
                    "fast": _variant(
                        "optimized", 5e-4, {"passed": not failed, "error": 0.5 if failed else 1e-7, "metric": "max_abs"}
                    ),
                },
            }
        )
    return {
        "scenario": {"name": "sweep", "entries": [{"technique": "pair", "params": {"seq_len": [128]}}]},
        "device": "cpu",
        "device_label": "CPU: test",
        "cases": cases,
        "status": "complete",
        "summary": {"passed": n_cases - 1, "failed": 1},
    }


def _printed(doc, terminal: bool, width: int = 100) -> str:
    buffer = io.StringIO()
    print_summary(doc, Console(file=buffer, force_terminal=terminal, width=width, color_system=None))
    return buffer.getvalue()


def test_log_summary_is_one_plain_line_per_case_and_the_terminal_keeps_the_table():
    doc = _results_doc(6)
    log = _printed(doc, terminal=False).splitlines()
    # a title, a header, one line per case, then the totals: nothing wraps at 100 columns
    assert log[0] == "sweep on CPU: test: 6 cases"
    assert log[1].split()[:3] == ["case", "baseline", "optimized"]
    rows = log[2:8]
    assert log[8].startswith("5 passed, 1 failed")
    assert not BOX & set("".join(log))
    for i, row in enumerate(rows):
        assert row.startswith(f"pair seq_len={128 * (i + 1)} ")  # only the param that varies
        assert f"slow {1 * (i + 1):.3g} ms" in row and "fast 500 us" in row
        assert f"{2.0 + i:.2f}x [{1.9 + i:.2f}, {2.1 + i:.2f}]" in row
    assert "passed" in rows[0] and "pass max_abs=1.0e-07" in rows[0]
    assert "FAIL max_abs=5.0e-01" in rows[5] and "failed: optimized fast: check failed" in rows[5]
    # the speedup column lines up: one width for every row
    assert len({row.index("x [") for row in rows}) == 1
    table = _printed(doc, terminal=True, width=200)
    assert BOX & set(table) and "speedup [95% CI]" in table


def test_a_run_into_a_log_ends_with_one_summary_line_per_case(note_scenario, tmp_path):
    path = note_scenario(3)
    result = invoke("run", "--scenario", path, "--out", tmp_path / "runs", "--no-calibrate", "--isolation", "none")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("notes on "))  # the summary's title
    summary = lines[start + 2 : start + 5]
    assert [line.split()[:2] for line in summary] == [["note_pair", f"i={i}"] for i in range(3)]
    assert all(line.rstrip().endswith("passed") for line in summary)
    assert lines[start + 5].startswith("3 passed, 0 failed")


# -- labels -----------------------------------------------------------------------------------------


def test_labels_show_the_kv_heads_a_zero_stands_for():
    assert case_params({"params": {"heads": 8, "kv_heads": 0}}) == "heads=8 kv_heads=8"
    assert case_params({"params": {"heads": 8, "kv_heads": 2}}) == "heads=8 kv_heads=2"

    class Change:
        def __init__(self, case_id):
            self.case_id = case_id

    labels = case_labels([Change("fa[heads=8,kv_heads=0]"), Change("fa[heads=8,kv_heads=2]")])
    assert labels == {"fa[heads=8,kv_heads=0]": "fa kv_heads=8", "fa[heads=8,kv_heads=2]": "fa kv_heads=2"}
    assert "kv_heads=0" not in _printed(_results_doc(2), terminal=False)


# -- notices from inside a case ---------------------------------------------------------------------


@pytest.mark.e2e
def test_a_notice_from_a_case_in_a_worker_process_reaches_the_run_output(note_scenario, tmp_path):
    result = invoke("run", "--scenario", note_scenario(2), "--out", tmp_path / "runs", "--no-calibrate")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: note_pair: building case {i} (a slow step, said out loud)" for i in range(2)]
    # ... before its case's progress line
    lines = result.output.splitlines()
    assert lines.index(notes[0]) < next(i for i, x in enumerate(lines) if x.startswith("[1/2]"))


def test_the_speculative_pair_says_when_it_trains_its_models(tmp_path, monkeypatch):
    from gpubench.models import train_small
    from gpubench.models.llama import LlamaConfig
    from gpubench.records import notices

    # A pair a few steps small (the real one takes ~25 s); the notice is the same.
    tiny = dict(
        target_config=LlamaConfig(
            vocab_size=256, hidden_size=16, num_layers=2, num_heads=1, num_kv_heads=1, head_dim=16, intermediate_size=32
        ),
        draft_config=LlamaConfig(
            vocab_size=256, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=16, intermediate_size=32
        ),
        target_recipe=train_small.Recipe(steps=2, batch=2, seq_len=16),
        draft_recipe=train_small.Recipe(steps=2, batch=2, seq_len=16, seed=3),
    )
    monkeypatch.setattr(train_small, "_MEMO", {})
    heard = []
    with notices.listening(heard.append):
        train_small.trained_pair(tmp_path, **tiny)
        monkeypatch.setattr(train_small, "_MEMO", {})
        train_small.trained_pair(tmp_path, **tiny)  # from the disk cache now: nothing to say
    assert len(heard) == 1, heard
    assert heard[0].startswith("speculative_decoding: training the draft and target models once")
    assert str(tmp_path / "spec_pair") in heard[0]


# -- the regression gate's hint, and closed pipes -------------------------------------------------


def _gate_doc(scenario: str, ids, scale: float = 1.0) -> dict:
    samples = list(np.random.default_rng(0).normal(1e-3, 1e-6, 20))
    return {
        "kind": "gpubench.results",
        "schema_version": 1,
        "run_id": scenario,
        "device_label": "CPU: test",
        "status": "complete",
        "scenario": {"name": scenario, "entries": [{"technique": "t", "name": scenario}]},
        "cases": [
            {
                "id": i,
                "technique": "t",
                "status": "passed",
                "failure": None,
                "params": {},
                "variants": {
                    "b": {"role": "baseline", "samples_s": samples},
                    "o": {"role": "optimized", "samples_s": [x * scale for x in samples]},
                },
            }
            for i in ids
        ],
    }


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_the_force_hint_for_different_scenarios_leads_to_a_command_that_works(tmp_path):
    base = _write(tmp_path / "base.json", _gate_doc("big", ["a", "b", "c"]))
    cur = _write(tmp_path / "cur.json", _gate_doc("small", ["a"]))
    refused = invoke("compare", base, cur)
    assert refused.exit_code == 2 and "pass --force" in refused.output
    forced = invoke("compare", base, cur, "--force")  # what the hint says, nothing more
    assert forced.exit_code == 0, forced.output
    assert "2 missing" in forced.output and "cases only in the baseline do not fail the gate" in forced.output
    # Same scenario, a case lost: still a failure (--force is about definitions, not lost cases).
    lost = _write(tmp_path / "lost.json", _gate_doc("big", ["a"]))
    assert invoke("compare", base, lost).exit_code == 1


def _with_closed_stdout(*args, cwd=None) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte, as after `| head -0`
    try:
        return subprocess.run(
            [sys.executable, "-m", "gpubench.cli", *map(str, args)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    finally:
        os.close(write)


@pytest.mark.e2e
def test_a_closed_pipe_does_not_change_the_gates_exit_code(tmp_path):
    base = _write(tmp_path / "base.json", _gate_doc("s", ["a", "b"]))
    slower = _write(tmp_path / "slow.json", _gate_doc("s", ["a", "b"], scale=1.5))
    passing = _with_closed_stdout("compare", base, base)
    assert passing.returncode == 0, passing.stderr
    assert "BrokenPipe" not in passing.stderr and "Traceback" not in passing.stderr
    regressed = _with_closed_stdout("compare", base, slower)
    assert regressed.returncode == 1, regressed.stderr  # the gate's own code, not the pipe's


@pytest.mark.e2e
def test_a_closed_pipe_does_not_stop_a_run(note_scenario, tmp_path):
    result = _with_closed_stdout(
        "run", "--scenario", note_scenario(2), "--out", tmp_path / "runs", "--no-calibrate", "--isolation", "none"
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(next((tmp_path / "runs").glob("*/results.json")).read_text())
    assert doc["status"] == "complete" and doc["summary"]["passed"] == 2


# -- dry runs and large runs ----------------------------------------------------------------------


def test_dry_run_lists_and_estimates_without_running_or_writing(note_scenario, tmp_path):
    out = tmp_path / "runs"
    result = invoke("run", "--scenario", note_scenario(5), "--out", out, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "notes" in result.output and ": 5 cases" in result.output
    assert re.search(r"note_pair 5 cases: i=0; i=1; i=2; \.\.\. \(2 more\)", result.output), result.output
    assert "estimated time: " in result.output and "from its measurement policy" in result.output
    assert "note:" not in result.output  # no case was built
    assert not out.exists()


def test_dry_run_validates_like_a_run(write_scenario):
    bad = write_scenario("name: x\nentries:\n  - technique: flash_attention\n    params: {head_dim: 80}\n")
    result = invoke("run", "--scenario", bad, "--dry-run")
    assert result.exit_code == 2 and "flash_attention.head_dim: 80 is not one of" in result.output


def test_a_huge_sweep_is_counted_not_built(tmp_path, monkeypatch):
    # 50 x 50 x 50 x 2 = 250,000 cases; the dry run may build only the few it shows.
    lengths = list(range(16, 816, 16))
    path = tmp_path / "huge.yaml"
    path.write_text(
        "name: huge\nentries:\n  - technique: flash_attention\n    params:\n"
        f"      seq_len: {lengths}\n      batch: {list(range(1, 51))}\n"
        f"      heads: {list(range(1, 51))}\n      causal: [false, true]\n"
    )
    built = []
    real = scenariomod.Scenario.entry_cases

    def counting(self, entry, repeat_scale=1.0):
        for case in real(self, entry, repeat_scale):
            built.append(case)
            yield case

    monkeypatch.setattr(scenariomod.Scenario, "entry_cases", counting)
    result = invoke("run", "--scenario", path, "--dry-run", "--out", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert "250,000 cases" in result.output and "(249,997 more)" in result.output
    assert len(built) == cli_run.DRY_RUN_IDS


def test_a_large_run_is_announced_with_its_count_and_measured_estimate(note_scenario, tmp_path, monkeypatch):
    out = tmp_path / "runs"
    first = invoke("run", "--scenario", note_scenario(3), "--out", out, "--no-calibrate", "--isolation", "none")
    assert first.exit_code == 0 and "warning:" not in first.output
    # Past the limit, a run says how many cases and how long before it starts; the estimate now
    # rests on the first run's measured times of the same cases.
    monkeypatch.setattr(cli_run, "LARGE_RUN_CASES", 2)
    second = invoke("run", "--scenario", note_scenario(3), "--out", out, "--no-calibrate", "--isolation", "none")
    assert second.exit_code == 0, second.output
    lines = second.output.splitlines()
    warning = next(line for line in lines if line.startswith("warning:"))
    assert "3 cases (more than 2); estimated time" in warning
    assert "3 of 3 cases from what they took on this device" in warning
    assert lines.index(warning) < next(i for i, x in enumerate(lines) if x.startswith("[1/3]"))
    # A case this device never ran counts its technique's mean in --out's runs; with no such runs,
    # its policy.
    dry = invoke("run", "--scenario", note_scenario(4), "--out", out, "--dry-run")
    assert "3 of 4 cases from what they took on this device" in dry.output
    assert "1 of 4 cases from earlier runs" in dry.output and "measurement policy" not in dry.output
    dry = invoke("run", "--scenario", note_scenario(4), "--out", tmp_path / "elsewhere", "--dry-run")
    assert "earlier runs in" not in dry.output and "the other cases from its measurement policy" in dry.output, (
        dry.output
    )


def test_dry_run_estimates_from_this_devices_case_times(note_scenario, tmp_path, device_cache):
    """A second run's estimate is what the first run's cases took on this device, plus the
    run's start-up and its report's time per case as measured, wherever the first run wrote its
    results (--out). The first run's cases run in this process (--isolation none): its case
    times and start-up are recorded the same way whichever runs them."""
    from gpubench.measure import env as envmod
    from gpubench.measure.devicecache import CaseTimes

    run = invoke(
        "run", "--scenario", note_scenario(3), "--out", tmp_path / "a", "--no-calibrate", "--isolation", "none"
    )
    assert run.exit_code == 0, run.output
    history = CaseTimes(envmod.device_label(envmod.resolve_device("cpu")))
    assert history.path.parent.parent == device_cache
    seconds, overhead, report_s = history.read_all()
    doc = json.loads(next((tmp_path / "a").glob("*/results.json")).read_text())
    assert sorted(seconds) == sorted(f"{c['id']}@1" for c in doc["cases"])
    assert overhead == pytest.approx(doc["time_use"]["wall_s"] - doc["time_use"]["cases_s"], abs=2e-3)

    dry = invoke("run", "--scenario", note_scenario(3), "--out", tmp_path / "b", "--dry-run")
    assert report_s is not None and report_s > 0  # the report's time per case, measured by the run
    expected = sum(seconds.values()) + overhead + 3 * report_s
    assert "3 of 3 cases from what they took on this device" in dry.output, dry.output
    assert f"estimated time: about {duration_text(expected)}" in dry.output, (expected, dry.output)
    # Another repeat scale is another measurement policy: not counted from these times.
    dry = invoke("run", "--scenario", note_scenario(3), "--out", tmp_path / "b", "--dry-run", "--repeat-scale", "2")
    assert "on this device" not in dry.output


# -- wording the docs and `gpubench list` show ---------------------------------------------------


def test_the_docs_scenario_error_is_what_the_tool_prints(tmp_path, monkeypatch):
    readme = (ROOT / "docs" / "scenarios.md").read_text()
    block = re.search(r"```\n(error: scenarios/x\.yaml: the scenario is not valid.*?)```", readme, re.S).group(1)
    lines = {}
    for line in block.splitlines()[1:]:
        number, rest = re.match(r"  scenarios/x\.yaml:(\d+): (.*)", line).groups()
        lines[int(number)] = rest
    # Rebuild the file docs/scenarios.md describes: each named line holds the mistake it names.
    text = [
        "name: x",
        "description: an example",
        "",
        "policy: {min_reps: 5}",
        "entries:",
        "  - technique: flash_attention",
        "    params:",
        "      batch: 1",
        "      heads: 4",
        "",
        "      seq_len: [128, 512]",
        "",
    ]
    text[2] = "devise: cpu"
    text[11] = "      head_dim: " + re.search(r"head_dim: (\d+)", lines[12]).group(1)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "x.yaml").write_text("\n".join(text) + "\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--scenario", "scenarios/x.yaml")
    assert result.exit_code == 2
    assert result.output.strip() == block.strip()


def test_list_claims_no_duration_gpu_quick_has_outgrown():
    out = invoke("list").output
    line = next(x for x in out.splitlines() if x.strip().startswith("gpu-quick"))
    assert "under 5 minutes" not in line and "more than 8 minutes" in line


def test_a_trace_line_without_output_len_names_the_line_file_and_what_each_line_needs(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_len": 4, "output_len": 2}\n{"arrival_s": 0.1, "prompt_len": 4}\n')
    result = invoke("serve", "--trace", trace, "--engine", "continuous+paged", "--max-len", "64")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        f"line 2 of {trace}: 'output_len' is missing; each line needs arrival_s (seconds >= 0), "
        "prompt_len (tokens >= 1) or prompt (text), and output_len (tokens >= 1)"
    ) in result.output


def test_labels_name_the_params_that_vary_counted_from_the_grids_as_from_the_built_cases():
    from gpubench.reports.terminal import shown_params

    scen = scenariomod.load("smoke")
    cases = scen.cases()
    for technique, keys in scen.varying().items():
        grid_keys = {k for e in scen.entries if e.technique == technique for k in e.grid}
        assert keys == shown_params([c.params for c in cases if c.technique == technique], grid_keys), technique
    assert scen.count() == {t: sum(c.technique == t for c in cases) for t in scen.count()}
