"""The GPU regression workflow: a self-hosted GPU runner must never run a fork's pull request, and a
first run on a GPU with no stored baseline says how to store one instead of failing on a missing file."""
import json
import re
import sys
from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "gpu-regression.yml"


def load() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return {**doc, "on": doc.get("on", doc.get(True))}  # YAML 1.1 reads a bare `on` as True


def test_fork_pull_requests_never_reach_the_self_hosted_runner():
    doc = load()
    assert "pull_request_target" not in doc["on"]  # would run with the repository's secrets
    for name, job in doc["jobs"].items():
        if "self-hosted" in job["runs-on"]:
            condition = job.get("if", "")
            assert "github.event.pull_request.head.repo.full_name == github.repository" in condition, name
            assert "github.event_name != 'pull_request'" in condition, name


def test_a_missing_baseline_is_a_warning_with_instructions_and_the_gate_is_skipped(tmp_path, monkeypatch, capsys):
    steps = {s.get("id"): s for s in load()["jobs"]["gpu-quick"]["steps"] if s.get("id")}
    look, gate = steps["stored"], steps["gate"]
    assert "steps.stored.outputs.found == 'yes'" in gate["if"]
    assert "save_baseline" in look["run"] and "baseline save" in look["run"] and "::warning" in look["run"]
    # The step's Python (the store path the gate will read) works against a real results file: run
    # as `python -c` runs it (its own namespace, its own imports, argv after the code), in this
    # process rather than a fresh interpreter importing torch again.
    code = re.search(r"python -c '([^']+)'", look["run"]).group(1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({
        "kind": "gpubench.results", "schema_version": 2, "status": "complete", "device_label": "NVIDIA H200",
        "scenario": {"name": "gpu-quick"}, "cases": [], "summary": {"passed": 0, "failed": 0}}))
    monkeypatch.setattr(sys, "argv", ["-c", str(tmp_path / "store"), str(run_dir)])
    exec(compile(code, "<workflow step 'stored'>", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip() == str(tmp_path / "store" / "NVIDIA-H200" / "gpu-quick.json")
